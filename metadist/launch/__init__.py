"""Launching training beyond one local process group: Slurm jobs and hyper-parameter sweeps.

`metadist.launch.slurm` writes and submits sbatch scripts that run `torchrun` on every
node with checkpoint-and-requeue on preemption; `metadist.launch.sweep` runs Optuna
studies whose trials are separate training runs.
"""
