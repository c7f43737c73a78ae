"""Evaluation sharded across processes: `metadist eval ... --nproc-per-node 2` (real
torchrun ranks, gloo) writes exactly the report one process writes, for few-shot
classification (from scratch, pretrained embedding, raw classifiers) and forecasting
(from scratch, statistical baselines, the figure's examples)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tiny_runs import tiny_store, train_tiny

from metadist.commands.evaluate import main as eval_main
from metadist.eval.cache import PREDICTIONS_FILE, PRETRAINED_FILE
from metadist.eval.shard import EvalShard, Reiterable, predict_share
from metadist.launch.children import descendants

ROOT = Path(__file__).resolve().parents[1]
# what differs between two evaluations of the same tasks: times, paths, cache notes
_VOLATILE = {"seconds", "timings", "paths", "reused", "processes"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("shard")
    return tiny_store(root, num_entities=40, seed=3)


def _eval(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """`metadist eval` in a process of its own (killing whatever it leaves behind)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", "metadist.cli", "eval", f"run_dir={run_dir}", *args]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = process.communicate(timeout=150)
    finally:
        leftover = descendants(process.pid)
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def _stable(value):
    """`metrics.json` without what differs between two evaluations of the same tasks."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _one_and_sharded(run_dir: Path, monkeypatch, *overrides: str) -> tuple[Path, Path]:
    """The run evaluated by one process (this one, on one thread as `metadist eval` runs)
    and, a copy of it, by two torchrun ranks."""
    copy = run_dir.parent / f"{run_dir.name}-sharded"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("eval"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # eval_threads: one thread
    assert eval_main([f"run_dir={run_dir}", *overrides]) == 0
    sharded = _eval(copy, "--nproc-per-node", "2", *overrides)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "Traceback" not in sharded.stderr, sharded.stderr[-3000:]
    assert sharded.stdout.count("metrics.json") == 1  # rank 0 reports, once
    return run_dir / "eval", copy / "eval"


def _assert_same_report(one: Path, two: Path, batch_size: int) -> None:
    pd.testing.assert_frame_equal(
        pd.read_parquet(one / "tasks.parquet"),
        pd.read_parquet(two / "tasks.parquet"),
        check_exact=True,  # the very numbers: no tolerance
    )
    first = json.loads((one / "metrics.json").read_text())
    second = json.loads((two / "metrics.json").read_text())
    assert _stable(second) == _stable(first)
    assert "processes" not in first["settings"]
    # every batch predicted once, by one rank or the other
    processes = second["settings"]["processes"]
    assert processes.startswith("2 (batches predicted by each: "), processes
    counts = [int(n) for n in re.split(r"[;)]", processes.split("each: ")[1])[0].split(", ")]
    assert len(counts) == 2 and sum(counts) == -(-first["num_tasks"] // batch_size)


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_sharded_few_shot_evaluation_equals_one_process(store, tmp_path, monkeypatch):
    run_dir = train_tiny(
        store,
        tmp_path / "protonet",
        "experiment=synthetic_protonet",
        "data.fractions=[0.5,0,0.5]",
        "sampler.options.num_ways=2",
        "sampler.options.num_shots=1",
        "sampler.options.num_query=2",
        "sampler.options.lookback=16",
    )
    # 3 batches of 4 (the last one short): rank 0 predicts two, rank 1 one
    overrides = [
        "eval.scratch_steps=3",
        "eval.pretrain_steps=4",
        "eval.tasks_per_unit=1",
        "eval.max_tasks=11",
        "eval.batch_size=4",
    ]
    one, two = _one_and_sharded(run_dir, monkeypatch, *overrides)
    _assert_same_report(one, two, batch_size=4)
    metrics = json.loads((two / "metrics.json").read_text())
    assert metrics["num_tasks"] == 11
    assert {"scratch", "pretrained", "one_nn"} <= set(metrics["methods"])
    # rank 0 kept both ranks' from-scratch predictions and its Baseline++ scores (one
    # entry each a batch: 3 batches), as one process does, and the pretrained embedding
    assert _kept_entries(two) == _kept_entries(one) and len(_kept_entries(one)) == 6
    assert (two / PRETRAINED_FILE).is_file()


def _kept_entries(eval_dir: Path) -> set[str]:
    with np.load(eval_dir / PREDICTIONS_FILE) as saved:
        return set(json.loads(str(saved["index"]))["entries"])


# slow (15 s): `make test` keeps the few-shot case above; this one runs in `make test-slow`
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_sharded_forecast_evaluation_equals_one_process(store, tmp_path, monkeypatch):
    run_dir = train_tiny(
        store, tmp_path / "maml", "experiment=synthetic_maml", "data.fractions=[0.5,0,0.5]"
    )
    overrides = ["eval.scratch_steps=3", "eval.batch_size=3", "eval.num_examples=4"]
    one, two = _one_and_sharded(run_dir, monkeypatch, *overrides)
    _assert_same_report(one, two, batch_size=3)
    pd.testing.assert_frame_equal(
        pd.read_parquet(one / "forecasts.parquet"),
        pd.read_parquet(two / "forecasts.parquet"),
        check_exact=True,
    )
    assert (two / "forecasts.png").is_file()
    assert json.loads((two / "metrics.json").read_text())["num_tasks"] > 3


def test_a_world_of_one_owns_every_batch_and_gathers_its_own():
    shard = EvalShard()
    batches = Reiterable(lambda: iter([1, 2, 3]))
    assert list(batches) == list(batches) == [1, 2, 3]
    started = []
    got = predict_share(shard, batches, lambda b: {"x": b * 10}, started.append)
    assert got == {0: {"x": 10}, 1: {"x": 20}, 2: {"x": 30}} and started == [1, 2, 3]
    assert [EvalShard(1, 3).owns(i) for i in range(6)] == [False, True, False] * 2
    with pytest.raises(ValueError, match="rank 2 of 2"):
        EvalShard(2, 2)


def test_bad_nproc_per_node_is_one_line(tmp_path, capsys):
    assert eval_main([f"run_dir={tmp_path}", "--nproc-per-node", "0"]) == 2
    assert eval_main([f"run_dir={tmp_path / 'none'}", "--nproc-per-node", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "metadist eval: error: --nproc-per-node must be >= 1, got 0",
        f"metadist eval: error: run_dir {tmp_path / 'none'}: no such directory",
    ]


def test_ranks_without_a_batch_are_noted():
    """More processes than batches: the report says how many had none."""
    from metadist.eval.shard import EvalShard

    shard = EvalShard(0, 4)
    shard.batches_per_rank = [0, 1, 0, 0]
    assert shard.describe() == (
        "4 (batches predicted by each: 0, 1, 0, 0; 3 had none: fewer batches than "
        "processes (a smaller eval.batch_size, or fewer processes))"
    )
    shard.batches_per_rank = [2, 1, 1, 1]
    assert shard.describe() == "4 (batches predicted by each: 2, 1, 1, 1)"
