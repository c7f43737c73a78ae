"""Submitting a written sbatch script with Slurm's `sbatch`."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path


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
        said = "; ".join(line.strip() for line in completed.stderr.splitlines() if line.strip())
        raise ValueError(f"sbatch refused the job: {said}")
    return completed.stdout.strip().split(";")[0]
