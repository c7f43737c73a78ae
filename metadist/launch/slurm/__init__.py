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

The package, one room per idea: `job` (`SlurmJob`, the job's settings checked when it is
made), `script` (the sbatch script a job renders to, and writing it), `settings` (a job from
the `KEY=VALUE` tokens of the command line, its training config checked before submitting)
and `submit` (`sbatch`). The command line, `metadist slurm submit`, is
`metadist.commands.slurm`.
"""

from metadist.launch.slurm.job import SlurmJob, parse_time_limit
from metadist.launch.slurm.script import render_script, write_script
from metadist.launch.slurm.settings import (
    LAUNCH_KEYS,
    check_python,
    check_training_config,
    job_from_settings,
    parse_settings,
)
from metadist.launch.slurm.submit import find_sbatch, submit_script

__all__ = [
    "LAUNCH_KEYS",
    "SlurmJob",
    "check_python",
    "check_training_config",
    "find_sbatch",
    "job_from_settings",
    "parse_settings",
    "parse_time_limit",
    "render_script",
    "submit_script",
    "write_script",
]
