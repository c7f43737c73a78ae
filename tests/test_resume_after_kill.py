"""A 2-rank `metadist train --nproc-per-node=2` whose rank 1 is SIGKILLed mid-run, then
resumed by the same command, ends bit for bit where an uninterrupted run ends.

Real processes (torchrun, gloo, CPU) on a store-backed experiment whose strata make the
loader's deal to ranks depend on where it starts: dealt from the resumed position, the
ranks got the same tasks of a step in another arrangement, and the DDP-averaged
meta-gradient (a sum of per-rank means) differed in its last bits (3.7e-8 after 60 steps).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from metadist.datasets.synthetic import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
from metadist.launch.children import descendants
from metadist.store.ingest import ingest
from metadist.train import latest_checkpoint_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# 31 meta-train entities in 4 strata of 2, 9, 11 and 9: 3 steps of 8 tasks per epoch, and
# a deal from the 2nd step of epochs 1 and 2 (step 5's checkpoint) arranged them otherwise.
NUM_ENTITIES = 40
RUN = [
    "experiment=synthetic_maml",
    "model.options.hidden_sizes=[32]",
    "trainer.meta_steps=100",
    "trainer.meta_batch_size=8",
    "trainer.checkpoint_every=5",
    "trainer.keep_checkpoints=100",
    "trainer.eval_every=0",
    "trainer.num_threads=1",
    "data.verify_store=false",
    "logging.progress=false",
    "logging.wandb.mode=disabled",
    "logging.log_every=10",  # checkpoints of steps 5, 15, ... hold a record under way
]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("resume_kill")
    panel = tmp / "panel"
    write_synthetic_panel(
        panel, num_entities=NUM_ENTITIES, length_range=(120, 200), seed=3, nan_fraction=0
    )
    args = {**SYNTHETIC_INGEST_ARGS, "scaling": "per-entity", "nan": "ffill"}
    ingest(panel, tmp / "store", progress=False, **args)
    return tmp / "store"


def _command(store: Path, run_dir: Path) -> list[str]:
    return [
        *[sys.executable, "-m", "metadist.cli", "train", "--nproc-per-node=2", "--no-eval"],
        *RUN,
        f"data.store={store}",
        f"run_dir={run_dir}",
    ]


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of the training process of `rank` training into `run_dir`."""
    wanted = f"run_dir={run_dir}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        is_rank = b"metadist.train" in argv and b"metadist.launch.torchrun" not in argv
        if is_rank and wanted in argv and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def _kill_rank_after_first_checkpoint(command: list[str], run_dir: Path) -> str:
    """Runs `command`, SIGKILLs rank 1 once a checkpoint exists; returns its output."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoints" / "latest").exists():
            assert process.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
        victim = _rank_pid(run_dir, rank=1)
        assert victim is not None, "rank 1 not found"
        os.kill(victim, signal.SIGKILL)
        output, _ = process.communicate(timeout=120)
    finally:
        _stop(process)
    assert process.returncode == 1, output[-3000:]
    assert "rank 1 was killed by SIGKILL" in output, output[-3000:]
    return output


def _run(command: list[str]) -> tuple[int, str]:
    """Runs `command` to its end (at most 180 s); returns its exit status and stderr."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = process.communicate(timeout=180)
    finally:
        _stop(process)
    return process.returncode, err


def _stop(process: subprocess.Popen) -> None:
    """Kills `process` and whatever it left (never a training behind, even on failure)."""
    leftover = descendants(process.pid)
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)
    for pid in leftover:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _train_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    drop = ("time", "tasks_per_s")
    return [{k: v for k, v in r.items() if k not in drop} for r in records if r["split"] == "train"]


@pytest.mark.timeout(400)
@pytest.mark.skipif(
    not Path("/proc/self/environ").exists(),
    reason="finds the rank to kill in /proc/<pid>/environ (Linux only)",
)
def test_resume_after_a_rank_is_killed_equals_the_uninterrupted_run_bitwise(tmp_path, store):
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    code, err = _run(_command(store, straight_dir))
    assert code == 0, err[-3000:]

    _kill_rank_after_first_checkpoint(_command(store, killed_dir), killed_dir)
    stop_step = int(latest_checkpoint_state(killed_dir)["step"])
    assert 5 <= stop_step < 100
    code, err = _run(_command(store, killed_dir))
    assert code == 0, err[-3000:]
    assert f"at step {stop_step}" in err

    ends = [latest_checkpoint_state(d) for d in (straight_dir, killed_dir)]
    assert ends[0]["step"] == ends[1]["step"] == 100
    for name, value in ends[0]["learner"].items():
        assert torch.equal(value, ends[1]["learner"][name]), name
    for key, state in ends[0]["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, ends[1]["optimizer"]["state"][key][name]), (key, name)
    # the metrics too, also the first record after the resume
    assert _train_records(killed_dir) == _train_records(straight_dir)
