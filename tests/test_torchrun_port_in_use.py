"""`python -m metadist.launch.torchrun` given a rendezvous port another process listens
on: torchrun's store could not listen, and the launcher ended with a traceback of
torchrun's frames (`DistNetworkError ... EADDRINUSE`). It is one line naming the port's
trouble and the remedy, exit status 1, and the launcher's log directory is removed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_a_port_in_use_is_one_line(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("print('a rank ran')\n")
    (tmp_path / "tmp").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "metadist.launch.torchrun", "--nproc_per_node=2"]
        command += ["--master_addr=127.0.0.1", f"--master_port={port}", str(script)]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=100,
            # as the project's launchers start it (local_ranks: no notice of torchrun's
            # own about OMP_NUM_THREADS beside the line)
            env=dict(os.environ, TMPDIR=str(tmp_path / "tmp"), OMP_NUM_THREADS="1"),
        )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "a rank ran" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("torchrun: error: the rendezvous could not start: "), lines
    assert f"port: {port}" in lines[0] and "EADDRINUSE" in lines[0], lines
    assert lines[0].endswith("or --standalone to have one chosen"), lines
    assert list((tmp_path / "tmp").iterdir()) == []
