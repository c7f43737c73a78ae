"""`metadist competition`: an evaluation done again on the same inputs is read back, not
redone; anything it reads that changed (a checkpoint, the settings, the holdout, the
store) evaluates again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from metadist.commands.competition.reuse import (
    INPUTS_FILE,
    evaluated_before,
    inputs_digest,
    record_inputs,
)

ROOT = Path(__file__).resolve().parents[1]


def _run_dir(path: Path) -> Path:
    (path / "checkpoints").mkdir(parents=True)
    (path / "checkpoints" / "step_00000004.pt").write_bytes(b"weights")
    (path / "best.json").write_text('{"step": 4}')
    (path / "config.yaml").write_text("trainer: {}\n")
    return path


def test_the_digest_follows_every_input(tmp_path):
    runs = [_run_dir(tmp_path / "a"), _run_dir(tmp_path / "b")]
    holdout, store = tmp_path / "test.parquet", tmp_path / "store"
    holdout.write_bytes(b"holdout")
    store.mkdir()
    (store / "values.bin").write_bytes(b"\0" * 10)
    first = inputs_digest(runs, [store, holdout], ["eval.split=all"])
    assert inputs_digest(runs, [store, holdout], ["eval.split=all"]) == first
    changes = [
        lambda: (runs[1] / "checkpoints" / "step_00000004.pt").write_bytes(b"retrained"),
        lambda: (runs[0] / "best.json").write_text('{"step": 2}'),
        lambda: holdout.write_bytes(b"another holdout"),
        lambda: (store / "values.bin").write_bytes(b"\1" * 10),
        lambda: (runs[0] / "periods.json").write_text("{}"),
    ]
    seen = {first}
    for change in changes:
        change()
        now = inputs_digest(runs, [store, holdout], ["eval.split=all"])
        assert now not in seen
        seen.add(now)
    assert inputs_digest(runs, [store, holdout], ["eval.split=test"]) not in seen
    assert inputs_digest(runs[:1], [store, holdout], ["eval.split=all"]) not in seen


def test_only_a_complete_evaluation_of_the_same_inputs_is_read_back(tmp_path):
    run = _run_dir(tmp_path / "run")
    assert not evaluated_before(run, "d1")  # never evaluated
    (run / "eval").mkdir()
    for name in ("metrics.json", "tasks.parquet", "forecasts.parquet"):
        (run / "eval" / name).write_text("")
    record_inputs(run, "d1")
    assert evaluated_before(run, "d1")
    assert not evaluated_before(run, "d2")  # other inputs: the record goes
    assert not (run / "eval" / INPUTS_FILE).exists()
    assert not evaluated_before(run, "d1")
    record_inputs(run, "d1")
    (run / "eval" / "forecasts.parquet").unlink()  # an evaluation that did not finish
    assert not evaluated_before(run, "d1")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_validation_run_made_again_reads_its_evaluations_back(tmp_path):
    rng = np.random.default_rng(0)
    rows = {"train": [], "test": []}
    for i in range(6):
        t = np.arange(32 + 4)
        values = 50 + 0.3 * t + 4 * np.sin(2 * np.pi * t / 4) + rng.normal(0, 1, len(t))
        for step, value in zip(t, values, strict=True):
            rows["train" if step < 32 else "test"].append((f"Q{i}", int(step), float(value)))
    data = tmp_path / "data"
    data.mkdir()
    for part, records in rows.items():
        frame = pd.DataFrame(records, columns=["series_id", "t", "value"])
        frame.assign(frequency="Q", horizon=4, period=4).to_parquet(data / f"{part}.parquet")
    (data / "competition.yaml").write_text("stratum_col: null\nmetric: smape\n")
    out = tmp_path / "val"
    command = [sys.executable, "-m", "metadist.cli", "competition", str(data), "--validation"]
    command += ["--experiment", "competition_cpu", "--ets", "no", "--jobs", "1"]
    command += ["--lookbacks", "2", "3", "--loss-candidates", "smape", "--out", str(out)]
    command += ["trainer.meta_steps=4"]
    command += [
        "trainer.meta_batch_size=4",
        "trainer.eval_every=2",
        "model.options.hidden_sizes=[8]",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")

    def run() -> str:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    first = run()
    evaluations = first.count("== evaluate H=4 (") // 2  # announced, then timed
    assert evaluations == 2 and "read back" not in first  # the pair, and 2H alone
    metrics = out / "h4" / "L12-smape-s1" / "eval" / "metrics.json"
    written, choices = metrics.stat().st_mtime_ns, (out / "choices.json").read_text()
    again = run()
    assert again.count("   read back: ") == evaluations
    assert metrics.stat().st_mtime_ns == written  # not evaluated again
    assert (out / "choices.json").read_text() == choices
    # a member trained again (here: its best checkpoint moved) is evaluated again
    best = out / "h4" / "L8-smape-s1" / "best.json"
    best.write_text(json.dumps({**json.loads(best.read_text()), "moved": True}))
    third = run()
    assert third.count("   read back: ") == evaluations - 2  # both candidates hold the 2H run
    assert metrics.stat().st_mtime_ns > written
