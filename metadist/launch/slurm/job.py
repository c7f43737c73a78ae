"""`SlurmJob`: one sbatch job's settings, checked when it is made."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

from metadist.launch.slurm.script import render_script

_TIME_PATTERN = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")
# sbatch's words for no time limit (any case)
_NO_LIMIT = ("unlimited", "infinite", "-1")
# Node features combine with & | [ ] * ( ) (sbatch --constraint).
_SAFE_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:@%+=/&|*()\[\]-]+$")


def parse_time_limit(value: str) -> int | None:
    """Seconds in a Slurm time limit; None where it asks for no limit.

    Accepts Slurm's forms: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`, and no limit
    as sbatch reads it: `UNLIMITED`, `INFINITE` (any case), `-1`, or a limit of zero.

    Raises:
        ValueError: any other form.
    """
    if value.strip().lower() in _NO_LIMIT:
        return None
    match = _TIME_PATTERN.match(value.strip())
    if not match:
        raise ValueError(
            f"time={value!r} is not a Slurm time limit (use M, M:S, H:M:S, D-H, D-H:M or "
            "D-H:M:S, or UNLIMITED)"
        )
    groups = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "days" in groups:
        seconds = (
            groups["days"] * 86400
            + groups["dh"] * 3600
            + groups.get("dm", 0) * 60
            + groups.get("ds", 0)
        )
    elif "c" in groups:
        seconds = groups["a"] * 3600 + groups["b"] * 60 + groups["c"]
    elif "b" in groups:
        seconds = groups["a"] * 60 + groups["b"]
    else:
        seconds = groups["a"] * 60
    return seconds or None  # sbatch: "a time limit of zero requests that no time limit be imposed"


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
        time: Slurm time limit (`H:M:S`, `D-H:M:S`, …, `UNLIMITED`); the partition's
            default if unset.
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
            if limit is not None and limit <= self.signal_before:
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
        _check_directive_path("the job's log", self.output, patterns=True)
        _check_directive_path("the working directory", self.workdir, patterns=False)
        if (self.array is None) != (self.args_file is None):
            raise ValueError("array and args_file go together")
        if not self.train_args and self.args_file is None:
            raise ValueError("a Slurm job needs training arguments (experiment=NAME, …)")

    def render(self) -> str:
        """The sbatch script, ready to write and submit (`script.render_script`)."""
        return render_script(self)


def _check_directive_path(what: str, path: str, *, patterns: bool) -> None:
    """Refuses a path an `#SBATCH` line would not carry whole, quoted as the script
    writes it (`script.directive_value`): a line break ends the line, and `%` in
    `--output` is a file-name pattern (`patterns`: `%j` and the like are allowed in the
    file name only).

    Raises:
        ValueError: naming `what`, the path and the character.
    """
    found = re.search(r"[\n\r]", path)
    if found is None and patterns:
        found = re.search("%", os.path.dirname(path))
    if found is not None:
        raise ValueError(
            f"{what} {path!r} has {found.group()!r}, which a #SBATCH line does not carry "
            "(a line break ends it; % is a file-name pattern of the job's log); use a "
            "run_dir and working directory without it"
        )
