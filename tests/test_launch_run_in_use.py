"""`metadist train --nproc-per-node N` on a run directory another training writes to: one
line from the command before any rank starts, not rank 0's line and torchrun's after it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from metadist.runlock import RunLock


@pytest.mark.timeout(300)
def test_a_launch_on_a_run_directory_in_use_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "metadist.cli",
        "train",
        "experiment=sinusoid_maml",
        "trainer.meta_batch_size=24",
        "trainer.meta_steps=2",
        "logging.wandb.mode=disabled",
        f"run_dir={run_dir}",
        "--no-eval",
        "--nproc-per-node",
        "2",
    ]
    with RunLock(run_dir) as held:  # as a training running there holds it
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=280)
        assert held.held
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"metadist train: error: {run_dir} is in use by another writer: process "
        f"{os.getpid()} on host {socket.gethostname()} holds "
        f"{run_dir / '.lock'}; wait for it to finish, stop it, or use another run_dir"
    ]
    assert not (run_dir / "checkpoints").exists()
