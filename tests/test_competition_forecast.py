"""A competition's member run used on its own: `Run.forecast` and `metadist forecast`
forecast every series the competition forecast (short ones too) as it did, and `metadist
eval` does not re-score it outside the competition's protocol."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from competition_data import write_competition

import metadist

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
SHORT = "S001"  # an ANNUAL series (horizon 4) cut to 5 training values


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "metadist.cli", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def competition(tmp_path_factory):
    """A competition of horizon 4 (one lookback, a few meta-steps) whose series SHORT has
    5 training values: fewer than the run's 4 support windows of 8 + 4 rows allow even
    with 7 input rows padded (8)."""
    tmp = tmp_path_factory.mktemp("member")
    data = write_competition(tmp / "data")
    train = pq.read_table(data / "train.parquet").to_pandas()
    keep = (train.series_id != SHORT) | (train.t >= train[train.series_id == SHORT].t.max() - 4)
    train[keep].to_parquet(data / "train.parquet", index=False)
    out = tmp / "out"
    done = _cli(
        "competition", str(data), "--out", str(out), "--horizons", "4", "--lookbacks", "2",
        "--ets", "no", "--jobs", "1", "trainer.meta_steps=6", "trainer.meta_batch_size=8",
        "trainer.eval_every=3", "trainer.checkpoint_every=3", "model.options.hidden_sizes=[8]",
        "eval.scratch_steps=2",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"data": data, "out": out, "run": out / "h4" / "L8-smape-s1", "stdout": done.stdout}


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_forecast_serves_every_series_the_competition_forecast_as_it_did(competition, tmp_path):
    train = pq.read_table(competition["data"] / "train.parquet").to_pandas()
    annual = train[train.frequency == "ANNUAL"][["series_id", "t", "value"]]
    assert (annual.series_id == SHORT).sum() == 5
    run = metadist.load_run(competition["run"])
    table = run.forecast(annual, methods=["adapted", "unadapted"]).to_pandas()
    scored = pq.read_table(competition["out"] / "forecasts.parquet").to_pandas()
    scored["step"] = scored["step"] - scored["step"].min() + 1
    assert SHORT in set(scored.entity)
    for method in ("adapted", "unadapted"):
        ours = table[table.method == method].merge(
            scored, left_on=["series_id", "step"], right_on=["entity", "step"]
        )
        assert len(ours) == 4 * annual.series_id.nunique()
        np.testing.assert_allclose(ours["value"], ours[method], rtol=1e-5, atol=1e-5)
    # the command too: the short series does not stop the batch
    history = tmp_path / "annual.parquet"
    annual.to_parquet(history, index=False)
    done = _cli("forecast", str(competition["run"]), str(history), "--out", str(tmp_path / "f.pq"))
    assert done.returncode == 0, done.stderr
    assert pq.read_table(tmp_path / "f.pq").num_rows == len(table) // 2


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_eval_of_a_member_run_points_to_the_competition(competition):
    evaluated = competition["run"] / "eval" / "metrics.json"
    before = evaluated.read_bytes()
    done = _cli("eval", f"run_dir={competition['run']}", timeout=120)
    assert done.returncode == 2
    assert f"belongs to the competition output {competition['out']}" in done.stderr
    assert f"metadist competition {competition['data']} --out {competition['out']}" in (done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1
    assert evaluated.read_bytes() == before  # the competition's evaluation left in place


@pytest.mark.integration
def test_the_competitions_steps_say_what_they_evaluate(competition):
    assert "== evaluate H=4 (1 model) on ANNUAL" in competition["stdout"]
    assert (
        "data: 1 model per horizon, one ensemble per horizon"
        in (competition["out"] / "metrics.md").read_text()
    )


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_forecast_defaults_to_the_model_validation_chose(competition, tmp_path):
    """A test run given a validation run's choice records it in its evaluated run, whose
    forecasts then default to it (and a run without one drops an earlier choice)."""
    validation = tmp_path / "val"
    validation.mkdir()
    (validation / "adaptation.json").write_text(
        '{"protocol": "validation", "horizons": {"4": {"choice": "unadapted"}}}'
    )
    args = ["competition", str(competition["data"]), "--out", str(competition["out"])]
    args += ["--horizons", "4", "--lookbacks", "2", "--ets", "no", "--jobs", "1"]
    args += ["trainer.meta_steps=6", "trainer.meta_batch_size=8", "trainer.eval_every=3"]
    args += ["trainer.checkpoint_every=3", "model.options.hidden_sizes=[8]"]
    args += ["eval.scratch_steps=2"]
    done = _cli(*args, "--adaptation-from", str(validation))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the first run's evaluation, of the same inputs, read back (`reuse.py`)
    assert "   read back: " in done.stdout and "   reused: " not in done.stdout
    history = pq.read_table(competition["data"] / "train.parquet").to_pandas()
    history = history[history.series_id == "S002"][["series_id", "t", "value"]]
    run = metadist.load_run(competition["run"])
    table = run.forecast(history).to_pandas()
    assert table.method.unique().tolist() == ["unadapted"]
    explicit = run.forecast(history, methods=["unadapted"]).to_pandas()
    np.testing.assert_array_equal(table["value"], explicit["value"])
    done = _cli(*args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    again = metadist.load_run(competition["run"]).forecast(history)
    assert again.column("method").unique().to_pylist() == ["adapted"]
