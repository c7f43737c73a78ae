"""The sbatch script of a `SlurmJob`: `#SBATCH` directives, then a body that runs torchrun
on every node, checkpoints on SIGUSR1 and requeues the job."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from metadist.durable import atomic_write_text

if TYPE_CHECKING:  # job.py imports this module to render itself
    from metadist.launch.slurm.job import SlurmJob


def render_script(job: SlurmJob) -> str:
    """`job`'s sbatch script, ready to write and submit."""
    directives = [
        f"--job-name={job.job_name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={job.cpus_per_task}",
    ]
    if job.gpus_per_node > 0:
        directives.append(f"--gpus-per-node={job.gpus_per_node}")
    for name in ("time", "partition", "account", "qos", "mem", "constraint"):
        value = getattr(job, name)
        if value is not None:
            directives.append(f"--{name}={value}")
    if job.array is not None:
        directives.append(f"--array={job.array}")
    directives += [
        f"--signal=B:USR1@{job.signal_before}",
        "--requeue",
        "--open-mode=append",
        f"--output={directive_value(job.output)}",
        f"--chdir={directive_value(job.workdir)}",
        *job.sbatch_args,
    ]
    if job.port is None:
        port_line = "rdzv_port=$((20000 + SLURM_JOB_ID % 20000))"
    else:
        port_line = f"rdzv_port={job.port}"
    train_args = " ".join(shlex.quote(arg) for arg in job.train_args)
    extra_args = ""
    if job.args_file is not None:
        # The path may use ${SLURM_ARRAY_TASK_ID}, so only quote around it.
        args_path = job.args_file.replace('"', '\\"')
        extra_args = f'mapfile -t -O "${{#train_args[@]}}" train_args < "{args_path}"\n'
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {directive}" for directive in directives]
    lines.append(
        SCRIPT_BODY_TEMPLATE.format(
            nproc=job.nproc_per_node,
            port_line=port_line,
            train_args=train_args,
            extra_args=extra_args,
            python=shlex.quote(job.python),
            cpus=job.cpus_per_task,
            max_restarts=job.max_restarts,
        )
    )
    return "\n".join(lines)


def directive_value(value: str) -> str:
    """`value` double-quoted for an `#SBATCH` line, `\\` and `"` escaped: sbatch splits
    such a line at unquoted whitespace and ends it at an unquoted `#`, and reads quotes
    and backslash escapes as a shell does."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_script(job: SlurmJob, path: Path) -> Path:
    """Writes `job`'s script to `path` (directories created), returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, job.render())
    return path


SCRIPT_BODY_TEMPLATE = r"""
# Written by metadist (`metadist slurm submit`, or a sweep's wave). One srun task per
# node runs torchrun, which starts {nproc} training process(es) on that node; all of
# them meet at a c10d rendezvous on the first node of the allocation. SIGUSR1 (sent by Slurm before the time limit, see --signal)
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

# SIGTERM to this shell during the SIGUSR1 stop: a scancel, whose stop wins (a requeue
# here ran a cancelled job again), or Slurm's own requeue or preemption, which requeues
# the job itself.
if (( requeue_requested && term_received )); then
    echo "metadist: training stopped with status $status; SIGTERM (a cancel, requeue or preemption) came during the SIGUSR1 stop, so this script does not requeue job $SLURM_JOB_ID"
    exit "$status"
fi
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
