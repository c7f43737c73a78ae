"""A command killed outright (SIGKILL: nothing to catch, nothing forwarded) does not leave
its children training unobserved: each owned child asked the kernel for a SIGTERM when
the command ends (`launch/children.py`). The battery found torchrun and both ranks of a
`metadist train --nproc-per-node=2` training on after a `kill -9` of the command."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metadist.datasets.synthetic import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
from metadist.launch.children import alive, descendants, stop_with_parent_hook
from metadist.store.ingest import ingest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(stop_with_parent_hook() is None, reason="needs Linux prctl"),
]

# a command that owns one child, which notes SIGTERM before it ends
OWNER = """
import subprocess, sys, time
from metadist.launch.children import OwnedChildren
child = '''
import pathlib, signal, sys, time
def stop(signum, frame):
    pathlib.Path(sys.argv[1]).write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(120)
'''
with OwnedChildren("owner") as children:
    process = children.popen([sys.executable, "-c", child, sys.argv[1]], stdout=subprocess.PIPE)
    assert process.stdout.readline().strip() == b"ready"
    print(process.pid, flush=True)
    time.sleep(120)
"""


def _kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _gone_within(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(map(alive, pids)):
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


@pytest.mark.timeout(90)
def test_a_child_gets_sigterm_when_its_command_is_killed(tmp_path):
    note = tmp_path / "child_was_told"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(note)], stdout=subprocess.PIPE, text=True
    )
    child = None
    try:
        child = int(owner.stdout.readline())
        owner.kill()  # SIGKILL: the command can forward nothing
        owner.wait(timeout=30)
        assert _gone_within([child], 20) == [], "the child outlived its killed command"
        assert note.read_text() == "SIGTERM"  # told to stop, as a training checkpoints
    finally:
        if owner.poll() is None:
            owner.kill()
        _kill([child] if child else [])


@pytest.mark.slow  # ~30 s: a two-rank training
@pytest.mark.timeout(240)
def test_kill_9_of_a_two_rank_train_stops_torchrun_and_both_ranks(tmp_path):
    write_synthetic_panel(tmp_path / "panel", num_entities=12, length_range=(80, 120), seed=1)
    ingest(tmp_path / "panel", tmp_path / "store", progress=False, **SYNTHETIC_INGEST_ARGS)
    run_dir = tmp_path / "run"
    command = [
        *(sys.executable, "-m", "metadist.cli", "train", "--nproc-per-node=2", "--no-eval"),
        *("experiment=synthetic_maml", f"data.store={tmp_path / 'store'}", f"run_dir={run_dir}"),
        *("trainer.meta_steps=1000000", "trainer.meta_batch_size=2", "trainer.eval_every=0"),
        "model.options.hidden_sizes=[8]",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    train = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path
    )
    below: list[int] = []
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not (run_dir / "metrics.jsonl").exists():
            assert train.poll() is None, "the training ended before its first record"
            time.sleep(0.2)
        assert Path(run_dir / "metrics.jsonl").exists(), "the ranks never trained"
        below = descendants(train.pid)
        assert len(below) >= 3, below  # torchrun and two ranks
        train.kill()
        train.wait(timeout=30)
        assert _gone_within(below, 90) == [], "torchrun or a rank outlived kill -9"
    finally:
        if train.poll() is None:
            train.kill()
        _kill(below)
