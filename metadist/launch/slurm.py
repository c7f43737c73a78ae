"""Slurm jobs that run `torchrun` on every node and survive preemption by requeueing.

`metadist slurm submit experiment=NAME nodes=N gpus_per_node=G [time=… partition=…]
[training overrides] [--dry-run]` writes an sbatch script into the run directory and
submits it. The script starts one srun task per node; each runs
`python -m torch.distributed.run` (torchrun) with a c10d rendezvous on the first node of
the allocation, so every node's processes form one process group. All nodes share the run
directory, so a restarted job finds the run's `latest` checkpoint there.

Preemption and time limits: the job asks Slurm for SIGUSR1 to the batch shell
`signal_before` seconds before its end. The shell then sends SIGTERM to the training (which
torchrun passes to every process), the training writes a checkpoint and exits, and the
shell requeues the job with `scontrol requeue`. The requeued job (same id, output appended)
runs the same command, which resumes from the checkpoint. An external `scontrol requeue`
or a preemption works the same way, minus the shell's own requeue.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from metadist.durable import atomic_write_text

# Settings of `metadist slurm submit` that configure the job; every other KEY=VALUE goes to
# the training command as a Hydra override.
LAUNCH_KEYS = (
    "nodes",
    "gpus_per_node",
    "nproc_per_node",
    "cpus_per_task",
    "time",
    "partition",
    "account",
    "qos",
    "mem",
    "constraint",
    "job_name",
    "port",
    "signal_before",
    "max_restarts",
    "python",
)
_INT_KEYS = {
    "nodes",
    "gpus_per_node",
    "nproc_per_node",
    "cpus_per_task",
    "port",
    "signal_before",
    "max_restarts",
}
_TIME_PATTERN = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")
# Node features combine with & | [ ] * ( ) (sbatch --constraint).
_SAFE_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:@%+=/&|*()\[\]-]+$")


def parse_time_limit(value: str) -> int:
    """Seconds in a Slurm time limit.

    Accepts Slurm's forms: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`.

    Raises:
        ValueError: any other form.
    """
    match = _TIME_PATTERN.match(value.strip())
    if not match:
        raise ValueError(
            f"time={value!r} is not a Slurm time limit (use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S)"
        )
    groups = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "days" in groups:
        return (
            groups["days"] * 86400
            + groups["dh"] * 3600
            + groups.get("dm", 0) * 60
            + groups.get("ds", 0)
        )
    if "c" in groups:
        return groups["a"] * 3600 + groups["b"] * 60 + groups["c"]
    if "b" in groups:
        return groups["a"] * 60 + groups["b"]
    return groups["a"] * 60


@dataclass(frozen=True)
class SlurmJob:
    """One sbatch job running `torchrun -m metadist.train` on every node.

    Attributes:
        train_args: Hydra overrides of the training command (`experiment=…`, `run_dir=…`, …).
        output: path pattern of the job's log (Slurm `%j`, `%A`, `%a` allowed).
        nodes: number of nodes; one srun task (one torchrun) per node.
        gpus_per_node: GPUs requested per node; 0 on CPU-only nodes.
        nproc_per_node: training processes per node; defaults to `gpus_per_node`, or 1 on
            CPU-only nodes.
        cpus_per_task: CPUs for each node's task; defaults to `nproc_per_node`.
        time: Slurm time limit (`H:M:S`, `D-H:M:S`, …); the partition's default if unset.
        partition, account, qos, mem, constraint: passed to sbatch when set.
        job_name: the job's name; `metadist-<experiment>` by default.
        port: rendezvous port on the first node; derived from the job id if unset, so that
            jobs sharing a node do not collide.
        signal_before: seconds before the end at which SIGUSR1 asks for checkpoint + requeue.
        max_restarts: torchrun's `--max-restarts` (restarts of failed workers in place).
        python: interpreter on the compute nodes (shared file system assumed).
        workdir: directory the job runs in.
        array: sbatch `--array` range; each element appends the lines of `args_file`.
        args_file: with `array`, a file per element (`${SLURM_ARRAY_TASK_ID}` expands in it)
            whose lines are further training overrides.
        sbatch_args: extra `#SBATCH` options, verbatim (e.g. `--exclusive`).
    """

    train_args: tuple[str, ...]
    output: str
    nodes: int = 1
    gpus_per_node: int = 0
    nproc_per_node: int | None = None
    cpus_per_task: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    mem: str | None = None
    constraint: str | None = None
    job_name: str = "metadist"
    port: int | None = None
    signal_before: int = 300
    max_restarts: int = 0
    python: str = field(default_factory=lambda: sys.executable)
    workdir: str = field(default_factory=os.getcwd)
    array: str | None = None
    args_file: str | None = None
    sbatch_args: tuple[str, ...] = ()

    @property
    def processes_per_node(self) -> int:
        """`nproc_per_node` as resolved when the job was made (never None then)."""
        assert self.nproc_per_node is not None
        return self.nproc_per_node

    def __post_init__(self) -> None:
        for name, low in (("nodes", 1), ("gpus_per_node", 0), ("max_restarts", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        nproc = self.nproc_per_node
        if nproc is None:
            nproc = self.gpus_per_node if self.gpus_per_node > 0 else 1
        if not isinstance(nproc, int) or nproc < 1:
            raise ValueError(f"nproc_per_node must be an integer >= 1, got {nproc!r}")
        if self.gpus_per_node > 0 and nproc > self.gpus_per_node:
            raise ValueError(
                f"nproc_per_node={nproc} is more than gpus_per_node={self.gpus_per_node}: "
                "each process needs its own GPU (use gpus_per_node=0 for CPU processes)"
            )
        object.__setattr__(self, "nproc_per_node", nproc)
        cpus = self.cpus_per_task if self.cpus_per_task is not None else nproc
        if not isinstance(cpus, int) or cpus < 1:
            raise ValueError(f"cpus_per_task must be an integer >= 1, got {cpus!r}")
        object.__setattr__(self, "cpus_per_task", cpus)
        if self.port is not None and not 1024 <= self.port <= 65535:
            raise ValueError(f"port must be in 1024..65535, got {self.port}")
        if not isinstance(self.signal_before, int) or not 0 < self.signal_before <= 65535:
            raise ValueError(f"signal_before must be 1..65535 seconds, got {self.signal_before!r}")
        if self.time is not None:
            limit = parse_time_limit(self.time)
            if limit <= self.signal_before:
                raise ValueError(
                    f"time={self.time} ({limit} s) leaves no time to train before the "
                    f"checkpoint signal at signal_before={self.signal_before} s; "
                    "raise time or lower signal_before"
                )
        for name in ("partition", "account", "qos", "mem", "constraint", "job_name"):
            value = getattr(self, name)
            pattern = _SAFE_CONSTRAINT if name == "constraint" else _SAFE_VALUE
            if value is not None and not pattern.match(str(value)):
                raise ValueError(f"{name}={value!r} has characters sbatch does not accept")
        if (self.array is None) != (self.args_file is None):
            raise ValueError("array and args_file go together")
        if not self.train_args and self.args_file is None:
            raise ValueError("a Slurm job needs training arguments (experiment=NAME, …)")

    def render(self) -> str:
        """The sbatch script, ready to write and submit."""
        directives = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={self.cpus_per_task}",
        ]
        if self.gpus_per_node > 0:
            directives.append(f"--gpus-per-node={self.gpus_per_node}")
        for name in ("time", "partition", "account", "qos", "mem", "constraint"):
            value = getattr(self, name)
            if value is not None:
                directives.append(f"--{name}={value}")
        if self.array is not None:
            directives.append(f"--array={self.array}")
        directives += [
            f"--signal=B:USR1@{self.signal_before}",
            "--requeue",
            "--open-mode=append",
            f"--output={self.output}",
            f"--chdir={self.workdir}",
            *self.sbatch_args,
        ]
        if self.port is None:
            port_line = "rdzv_port=$((20000 + SLURM_JOB_ID % 20000))"
        else:
            port_line = f"rdzv_port={self.port}"
        train_args = " ".join(shlex.quote(arg) for arg in self.train_args)
        extra_args = ""
        if self.args_file is not None:
            # The path may use ${SLURM_ARRAY_TASK_ID}, so only quote around it.
            args_path = self.args_file.replace('"', '\\"')
            extra_args = f'mapfile -t -O "${{#train_args[@]}}" train_args < "{args_path}"\n'
        lines = ["#!/bin/bash"]
        lines += [f"#SBATCH {directive}" for directive in directives]
        lines.append(
            _SCRIPT_BODY_TEMPLATE.format(
                nproc=self.nproc_per_node,
                port_line=port_line,
                train_args=train_args,
                extra_args=extra_args,
                python=shlex.quote(self.python),
                cpus=self.cpus_per_task,
                max_restarts=self.max_restarts,
            )
        )
        return "\n".join(lines)


_SCRIPT_BODY_TEMPLATE = r"""
# Written by `metadist slurm submit`. One srun task per node runs torchrun, which starts
# {nproc} training process(es) on that node; all of them meet at a c10d rendezvous on the
# first node of the allocation. SIGUSR1 (sent by Slurm before the time limit, see --signal)
# makes the training checkpoint and exit, then this script requeues the job; the requeued
# job runs the same command and resumes from the run directory's latest checkpoint.
set -uo pipefail

head_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
{port_line}
train_args=({train_args})
{extra_args}echo "metadist: job $SLURM_JOB_ID start $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) on $SLURM_JOB_NODELIST, rendezvous $head_node:$rdzv_port"

srun_pid=""
requeue_requested=0
term_received=0
# SIGTERM to the job's steps (not this shell): torchrun passes it to its workers, which
# checkpoint and exit. Signalling srun itself would make it kill the step at once.
forward_term() {{
    if [[ -n "$srun_pid" ]]; then scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null || true; fi
}}
on_usr1() {{
    echo "metadist: SIGUSR1 received: checkpointing, then requeueing job $SLURM_JOB_ID"
    requeue_requested=1
    forward_term
}}
# A cancel, requeue, preemption or time limit: Slurm sends SIGTERM to every step itself.
# Nothing to forward: a scancel now is refused and retried until Slurm kills this shell
# (KillWait), which held each requeue back by half a minute.
on_term() {{
    echo "metadist: SIGTERM received: checkpointing and stopping"
    term_received=1
}}
trap on_usr1 USR1
trap on_term TERM

export PYTHONUNBUFFERED=1
srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --cpus-per-task={cpus} --kill-on-bad-exit=1 \
    {python} -m metadist.launch.torchrun \
        --nnodes="$SLURM_NNODES" --nproc_per_node={nproc} \
        --rdzv_backend=c10d --rdzv_endpoint="$head_node:$rdzv_port" --rdzv_id="$SLURM_JOB_ID" \
        --max_restarts={max_restarts} \
        -m metadist.train "${{train_args[@]}}" &
srun_pid=$!
if (( requeue_requested )); then forward_term; fi

# `wait` returns early when a trapped signal arrives; keep waiting until srun has exited.
status=0
while true; do
    wait "$srun_pid"
    status=$?
    kill -0 "$srun_pid" 2>/dev/null || break
done

if (( requeue_requested )); then
    echo "metadist: training stopped with status $status; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
fi
if (( term_received )); then
    echo "metadist: training stopped by SIGTERM with status $status"
else
    echo "metadist: training finished with status $status"
fi
exit "$status"
"""


def parse_settings(tokens: Sequence[str]) -> tuple[dict[str, object], list[str]]:
    """Splits `KEY=VALUE` tokens into launch settings and training overrides.

    Returns:
        (settings, overrides): `settings` holds the keys of `LAUNCH_KEYS` (ints converted),
        `overrides` every other token in its original order.

    Raises:
        ValueError: a token without `=`, a repeated launch key, or a non-integer value of an
            integer key.
    """
    settings: dict[str, object] = {}
    overrides: list[str] = []
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {token!r}")
        if key not in LAUNCH_KEYS:
            overrides.append(token)
            continue
        if key in settings:
            raise ValueError(f"{key} is given twice")
        if key in _INT_KEYS:
            try:
                settings[key] = int(value)
            except ValueError:
                raise ValueError(f"{key} must be an integer, got {value!r}") from None
        else:
            settings[key] = value
    return settings, overrides


def _override_value(overrides: Sequence[str], key: str) -> str | None:
    for token in overrides:
        name, _, value = token.partition("=")
        if name.lstrip("+") == key:
            return value
    return None


def job_from_settings(
    tokens: Sequence[str], sbatch_args: Sequence[str] = (), workdir: str | None = None
) -> tuple[SlurmJob, Path]:
    """Builds the job of `metadist slurm submit` from its `KEY=VALUE` tokens.

    `experiment=NAME` is required. `run_dir=` defaults to
    `runs/slurm/<experiment>-<date>-<time>` under `workdir`; it is made absolute and passed to the training, and the job's log goes to
    `<run_dir>/slurm/<job id>.out`.

    Returns:
        (job, run_dir).

    Raises:
        ValueError: missing experiment, or any invalid setting (named).
    """
    settings, overrides = parse_settings(tokens)
    experiment = _override_value(overrides, "experiment")
    if not experiment:
        raise ValueError("experiment=NAME is required (an experiment config in experiments/)")
    workdir = os.path.abspath(workdir or os.getcwd())
    run_dir_value = _override_value(overrides, "run_dir")
    if run_dir_value:
        run_dir = Path(workdir, run_dir_value).resolve()
        overrides = [t for t in overrides if t.partition("=")[0] != "run_dir"]
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = Path(workdir, "runs", "slurm", f"{experiment}-{stamp}").resolve()
    settings.setdefault("job_name", f"metadist-{experiment}")
    job = SlurmJob(
        train_args=(*overrides, f"run_dir={run_dir}"),
        output=str(run_dir / "slurm" / "%j.out"),
        workdir=workdir,
        sbatch_args=tuple(sbatch_args),
        **settings,  # type: ignore[arg-type]
    )
    return job, run_dir


def check_training_config(job: SlurmJob, config_dir: str | os.PathLike | None = None) -> None:
    """Composes and validates the job's training config as its ranks will, before submitting.

    Uses the training's own `load_config` with the job's world size
    (`nodes × nproc_per_node`), so an unknown experiment, an override Hydra cannot apply (a
    misspelt key included) or a global meta-batch that does not split over the ranks is
    reported now rather than when the job starts on the cluster.

    Args:
        job: the job; its `train_args` are the training's Hydra overrides. Array jobs
            (`args_file`) are checked per element by their creator (`metadist sweep`).
        config_dir: experiments directory; `None` looks it up as the training does.

    Raises:
        ValueError: the training would reject the config; the message names the setting,
            and a misspelt launch setting (`node=2`) gets the launch key it resembles.
        FileNotFoundError: no experiments directory, or `data.store` names no directory.
    """
    from metadist.train.compose import load_config

    world_size = job.nodes * job.processes_per_node
    try:
        load_config(list(job.train_args), config_dir, world_size=world_size)
    except ValueError as error:
        hints = []
        for token in job.train_args:
            key = token.partition("=")[0].lstrip("+~")
            close = difflib.get_close_matches(key, LAUNCH_KEYS, n=1, cutoff=0.8)
            if close and key not in LAUNCH_KEYS:
                hints.append(f"{token!r} is not a launch setting; did you mean {close[0]}=? ")
        raise ValueError(
            "".join(hints) + f"the training would reject this job ({job.nodes} node(s) x "
            f"{job.nproc_per_node} process(es) = world size {world_size}): {error}"
        ) from None


def find_sbatch() -> str:
    """Path of `sbatch`; `FileNotFoundError` if Slurm's client commands are not installed."""
    path = shutil.which("sbatch")
    if path is None:
        raise FileNotFoundError(
            "sbatch not found: run this on a Slurm login node, or install Slurm's client "
            "commands (Debian: apt-get install slurm-client)"
        )
    return path


def submit_script(script_path: Path, extra_args: Sequence[str] = ()) -> str:
    """Submits an sbatch script and returns the job id.

    Raises:
        FileNotFoundError: no `sbatch`.
        ValueError: sbatch refused the job (its message included).
    """
    completed = subprocess.run(
        [find_sbatch(), "--parsable", *extra_args, str(script_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise ValueError(f"sbatch refused {script_path}: {completed.stderr.strip()}")
    return completed.stdout.strip().split(";")[0]


def write_script(job: SlurmJob, path: Path) -> Path:
    """Writes `job`'s script to `path` (directories created), returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, job.render())
    return path


def _cmd_submit(args: argparse.Namespace) -> int:
    job, run_dir = job_from_settings(args.settings, sbatch_args=args.sbatch_arg)
    check_training_config(job)
    if args.dry_run:
        print(job.render(), end="")
        return 0
    find_sbatch()
    # Logs go to <run_dir>/slurm/; Slurm does not create the directory of --output.
    (run_dir / "slurm").mkdir(parents=True, exist_ok=True)
    script = write_script(job, run_dir / "slurm" / "job.sbatch")
    job_id = submit_script(script)
    print(f"submitted job {job_id}: run directory {run_dir}, log {run_dir}/slurm/{job_id}.out")
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist slurm submit`."""
    parser = subparsers.add_parser(
        "slurm",
        help="run training as a Slurm job (torchrun on every node, checkpoint + requeue)",
        description=__doc__.splitlines()[0],
    )
    commands = parser.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND", required=True)
    submit = commands.add_parser(
        "submit",
        help="write and submit an sbatch script",
        description=(
            "Write and submit an sbatch script. Launch settings: "
            + ", ".join(f"{key}=" for key in LAUNCH_KEYS)
            + "; every other KEY=VALUE (experiment=NAME is required) is passed to the "
            "training as a Hydra override."
        ),
    )
    submit.add_argument("settings", nargs="*", metavar="KEY=VALUE")
    submit.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    submit.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="an extra #SBATCH option, verbatim (repeatable), e.g. --sbatch-arg=--exclusive",
    )
    submit.set_defaults(func=_cmd_submit)


__all__ = [
    "LAUNCH_KEYS",
    "SlurmJob",
    "check_training_config",
    "job_from_settings",
    "parse_settings",
    "parse_time_limit",
    "register_cli",
    "submit_script",
    "write_script",
]
