"""SIGUSR1 (Slurm's warning before a preemption) to a command that started children
(`metadist train --nproc-per-node N`): the command stops them as for SIGTERM and says so,
rather than dying at once with its children still running."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from metadist.launch.children import alive

pytestmark = pytest.mark.integration

# The command: one child, which records the signal that stops it (a training checkpoints
# on SIGTERM; torchrun, which passes SIGTERM on to its ranks, would die of SIGUSR1).
COMMAND = textwrap.dedent(
    """
    import json, subprocess, sys
    from metadist.launch.children import OwnedChildren, StopRequested
    CHILD = '''
    import signal, sys, time
    def stop(signum, frame):
        open(sys.argv[1], "w").write(signal.Signals(signum).name)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGUSR1, stop)
    print("ready", flush=True)
    time.sleep(600)
    '''
    try:
        with OwnedChildren("demo-command", grace_s=30.0) as children:
            child = children.popen([sys.executable, "-c", CHILD, sys.argv[2]],
                                   stdout=subprocess.PIPE, text=True)
            child.stdout.readline()
            with open(sys.argv[1], "w") as out:
                json.dump({"child": child.pid}, out)
            child.wait()
    except StopRequested as stop:
        print(f"demo-command: {stop.summary}", file=sys.stderr)
        sys.exit(stop.exit_status)
    """
)


@pytest.mark.timeout(120)
def test_sigusr1_stops_the_children_with_sigterm_and_is_reported(tmp_path):
    pids_file, stopped_by = tmp_path / "pids.json", tmp_path / "stopped_by"
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND, str(pids_file), str(stopped_by)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (pids_file.exists() and pids_file.read_text()):
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        child = json.loads(pids_file.read_text())["child"]
        command.send_signal(signal.SIGUSR1)
        _, err = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode == 128 + signal.SIGUSR1
    assert err.strip().splitlines() == [
        "demo-command: stopped by SIGUSR1; 1 process it started stopped"
    ]
    assert stopped_by.read_text() == "SIGTERM"
    assert not alive(child)
