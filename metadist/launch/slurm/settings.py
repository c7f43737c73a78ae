"""A Slurm job from the `KEY=VALUE` tokens of `metadist slurm submit`, and the check of
its training config before it is submitted."""

from __future__ import annotations

import difflib
import os
import shutil
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from metadist.launch.slurm.job import SlurmJob
from metadist.train.compose import load_config
from metadist.train.config import TrainConfig

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
        ValueError: missing experiment, a `run_dir` that is a file, or any invalid setting
            (named).
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
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run_dir={run_dir_value} is a file ({run_dir}), not a directory")
    settings.setdefault("job_name", f"metadist-{experiment}")
    job = SlurmJob(
        train_args=(*overrides, f"run_dir={run_dir}"),
        output=str(run_dir / "slurm" / "%j.out"),
        workdir=workdir,
        sbatch_args=tuple(sbatch_args),
        **settings,  # type: ignore[arg-type]
    )
    return job, run_dir


def check_python(job: SlurmJob) -> None:
    """Refuses a job whose `python` names no program from where it is submitted: the
    nodes run it from a shared file system (as they read `run_dir` and `data.store`), in
    the job's working directory, so a typo would otherwise fail only once the job has
    left the queue.

    Raises:
        FileNotFoundError: naming the value and the default.
    """
    python, workdir = job.python, job.workdir
    if os.sep in python:
        path = Path(workdir, python)
        found = path.is_file() and os.access(path, os.X_OK)
    else:  # a command the nodes look up on their PATH, as this host does
        found = shutil.which(python) is not None
    if not found:
        raise FileNotFoundError(
            f"python={python!r}: no such program from here (the nodes run it from a shared "
            f"file system, in the working directory {workdir}); name the interpreter that "
            "has metadist, or leave python= out for the one running this command"
        )


def check_training_config(
    job: SlurmJob, config_dir: str | os.PathLike | None = None
) -> TrainConfig:
    """Composes and validates the job's training config as its ranks will, before
    submitting; returns it.

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
    world_size = job.nodes * job.processes_per_node
    try:
        return load_config(list(job.train_args), config_dir, world_size=world_size)
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
