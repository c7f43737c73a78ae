"""How the pipeline's steps are announced and timed: a step run in this process, or a
`metadist` subcommand run as a subprocess."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

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
    print(f"== {title}: {' '.join(command[2:])}", flush=True)
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    print(f"== {title}: {time.perf_counter() - began:.1f} s (exit status {done.returncode})")
    if done.returncode != 0:
        print((done.stdout[-3000:] + done.stderr[-3000:]).rstrip(), file=sys.stderr)
    return done.returncode
