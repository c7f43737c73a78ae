"""The interpreter of a sweep's Slurm trials: `--slurm python=PATH` where given (checked as
`metadist slurm submit` checks its `python=`), else the sweep's own."""

from __future__ import annotations

import os
from collections.abc import Sequence

from metadist.launch.slurm import check_python, job_from_settings, parse_settings


def slurm_python(slurm_settings: Sequence[str], default: str) -> str:
    """The interpreter a wave's array job runs: the `python=` of `slurm_settings`, else
    `default` (`SweepSettings.python`, the one running the sweep)."""
    launch, _ = parse_settings(slurm_settings)
    return str(launch.get("python", default))


def check_slurm_python(slurm_settings: Sequence[str]) -> None:
    """Refuses a `--slurm python=` naming no program from here, before the sweep creates
    anything (`check_python`: the nodes run it from a shared file system, in the working
    directory the waves are submitted from).

    Raises:
        FileNotFoundError: naming the setting.
    """
    launch, _ = parse_settings(slurm_settings)
    if "python" not in launch:
        return
    job, _ = job_from_settings(["experiment=x", *slurm_settings], workdir=os.getcwd())
    try:
        check_python(job)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"--slurm {error}") from None
