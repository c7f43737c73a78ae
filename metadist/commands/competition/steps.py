"""How the pipeline's steps are announced and timed: a step run in this process, or a
`metadist` subcommand run as a subprocess."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from metadist.launch.children import OwnedChildren

# the `metadist` command, run by this interpreter
METADIST = [sys.executable, "-m", "metadist.cli"]


def step(title: str, action: Callable[[], Any]) -> bool:
    """Runs `action`, announced by `title` before and with its seconds after."""
    print(f"== {title}", flush=True)
    began = time.perf_counter()
    action()
    print(f"== {title}: {time.perf_counter() - began:.1f} s", flush=True)
    return True


def run_command(title: str, command: list[str], env: dict[str, str]) -> int:
    """Runs `command` (`METADIST` and its arguments) and returns its exit status; the
    end of its output is shown where it fails."""
    shown = (
        ["metadist", *command[len(METADIST) :]] if command[: len(METADIST)] == METADIST else command
    )
    print(f"== {title}: {shlex.join(shown)}", flush=True)  # a command one can run again
    began = time.perf_counter()
    process = OwnedChildren.popen_owned(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stdout, stderr = process.communicate()
    OwnedChildren.release(process)
    print(f"== {title}: {time.perf_counter() - began:.1f} s (exit status {process.returncode})")
    if process.returncode != 0:
        print((stdout[-3000:] + stderr[-3000:]).rstrip(), file=sys.stderr)
    return process.returncode
