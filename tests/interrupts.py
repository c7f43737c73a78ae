"""Ctrl-C as a terminal sends it: SIGINT to a command's whole process group, once the
command has printed a given line."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def interrupt_after(
    argv: list[str], cwd: Path, marker: str, stream: str = "stdout", wait_s: float = 0.0
) -> tuple[int, str]:
    """Starts `argv` in a session of its own, sends SIGINT to its process group once a
    line of its `stream` ("stdout" or "stderr") starts with `marker` (and `wait_s` more
    seconds); returns its exit status and its stderr (after the marker, where that is the
    stream read). Whatever happens, nothing it started is left running."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        for line in getattr(process, stream):
            if line.startswith(marker):
                break
        time.sleep(wait_s)
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=150)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, err
