"""The `make run` pipeline at toy size, the evaluation CLI and holdout tasks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadist.eval.holdout import holdout_batches, read_holdout
from metadist.eval.settings import EXTRA_BASELINES, LEARNED_METHOD
from metadist.eval.settings import FORECAST_METHODS as ALL_FORECAST_METHODS
from metadist.store import SeriesStore
from metadist.store.ingest import ingest

# The methods every forecast evaluation scores (the extra baselines and the learned
# combination only when asked).
FORECAST_METHODS = {
    k: v
    for k, v in ALL_FORECAST_METHODS.items()
    if k not in EXTRA_BASELINES and k != LEARNED_METHOD
}

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    env.update(WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_make_run_pipeline_at_toy_size(tmp_path):
    out = tmp_path / "demo"
    command = [
        sys.executable,
        "-m",
        "metadist.demo",
        "--out",
        str(out),
        "--entities",
        "60",
        "--length-range",
        "150",
        "250",
        "--meta-steps",
        "4",
        "--nproc",
        "2",
        "eval.scratch_steps=5",
    ]
    done = subprocess.run(
        command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = out / "run"
    table = (run_dir / "eval" / "metrics.md").read_text()
    for label in FORECAST_METHODS.values():
        assert f"| {label} |" in table
    result = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert set(result["overall"]) == set(FORECAST_METHODS)
    assert result["num_tasks"] >= 4
    for method in FORECAST_METHODS:
        for metric in ("smape", "mase", "mae", "mse"):
            assert np.isfinite(result["overall"][method][metric]["value"]), (method, metric)
    figure = run_dir / "eval" / "forecasts.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(figure.resolve()) in done.stdout
    assert "4 meta-steps" in table
    assert "\n$ python -m metadist.launch.torchrun --standalone --nproc_per_node=2" in done.stdout

    # The evaluation CLI on the same run: with 0 inner steps, adapting changes nothing.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "metadist.eval",
            f"run_dir={run_dir}",
            "eval.inner_steps=0",
            "eval.scratch_steps=0",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    again = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert again["overall"]["adapted"] == again["overall"]["unadapted"]
    assert again["overall"]["naive"] == result["overall"]["naive"]

    # The demo's directory is not the run; the error names the run inside it.
    wrong = subprocess.run(
        [sys.executable, "-m", "metadist.eval", f"run_dir={out}"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert wrong.returncode == 1 and f"run_dir={run_dir})" in wrong.stderr, wrong.stderr

    # Re-running the demo evaluates again with its own settings, not the report above.
    rerun = subprocess.run(
        command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    latest = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert latest["settings"]["inner_steps"] == result["settings"]["inner_steps"] != 0
    assert latest["overall"]["adapted"] == result["overall"]["adapted"]
    assert "written at the end of training" not in rerun.stdout
    assert "confirmed, not trained again" in rerun.stdout  # no torchrun for a finished run


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_eval_cli_names_a_missing_run(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "metadist.eval", f"run_dir={tmp_path / 'nothing'}"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 1
    assert "no run directory" in done.stderr


def _write_long(path, rows):
    table = pa.table(
        {
            "series_id": pa.array([r[0] for r in rows], pa.string()),
            "t": pa.array([r[1] for r in rows], pa.int64()),
            "value": pa.array([r[2] for r in rows], pa.float64()),
        }
    )
    pq.write_table(table, path)


def test_holdout_tasks_never_reach_the_holdout(tmp_path):
    # value = 1000 * entity + t, so every value says where it comes from; the holdout of
    # entity e is t = n_e .. n_e + h_e - 1.
    lengths = {"A": 40, "B": 30, "C": 9}  # C is shorter than one window (L + H = 12)
    horizons = {"A": 6, "B": 6, "C": 8}
    train, test = [], []
    for e, (name, n) in enumerate(lengths.items()):
        train += [(name, t, 1000.0 * (e + 1) + t) for t in range(n)]
        test += [(name, t, 1000.0 * (e + 1) + t) for t in range(n, n + horizons[name])]
    _write_long(tmp_path / "train.parquet", train)
    _write_long(tmp_path / "test.parquet", test)
    store = ingest(
        tmp_path / "train.parquet",
        tmp_path / "store",
        entity_col="series_id",
        time_col="t",
        features=["value"],
        scaling="none",
        progress=False,
    )
    store = SeriesStore.open(tmp_path / "store")
    holdout = read_holdout(
        tmp_path / "test.parquet", store, entity_col="series_id", time_col="t", value_cols=["value"]
    )
    batches = list(
        holdout_batches(
            store,
            holdout,
            entities=np.arange(3),
            lookback=8,
            horizon=4,
            num_support=3,
            stride=2,
            input_columns=[0],
            target_columns=[0],
            batch_size=8,
        )
    )
    seen = {}
    for batch in batches:
        for b, entity in enumerate(batch.entity_index.tolist()):
            name = str(store.entity_ids[entity])
            first_test = 1000.0 * (entity + 1) + lengths[name]
            used = [batch.support.x[b], batch.support.y[b], batch.query.x[b]]
            assert max(float(t.max()) for t in used) < first_test
            truth = batch.query.y[b, 0, :, 0].numpy()
            assert truth.tolist() == [first_test + i for i in range(horizons[name])]
            assert float(batch.query.x[b, 0, -1, 0]) == first_test - 1  # the last training value
            seen[name] = batch.support.x.shape[1]
    # A: 3 windows; B: (30 - 12) // 2 + 1 = 10 > 3 windows; C: padded to exactly one.
    assert seen == {"A": 3, "B": 3, "C": 1}
    bad = tmp_path / "bad.parquet"
    _write_long(bad, [("A", 39, 1.0)])
    with pytest.raises(ValueError, match="not after its training part"):
        read_holdout(bad, store, entity_col="series_id", time_col="t", value_cols=["value"])
    _write_long(bad, [("Z", 50, 1.0)])
    with pytest.raises(ValueError, match="does not hold"):
        read_holdout(bad, store, entity_col="series_id", time_col="t", value_cols=["value"])


def test_a_holdout_with_pandas_microsecond_timestamps_follows_its_training_part(tmp_path):
    """pandas writes datetime64 columns as timestamp[us]; the store keeps epoch
    nanoseconds. The holdout's times are read in the store's unit, so a monthly holdout
    right after the training part is accepted (it was refused as overlapping), and the
    competition's scan reads both files in the same unit."""
    import pandas as pd

    from metadist.commands.competition.series import time_steps

    months = pd.date_range("2020-01-01", periods=30, freq="MS")
    frame = pd.DataFrame({"series_id": "A", "t": months, "value": np.arange(30.0)})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.set_column(1, "t", table.column("t").cast(pa.timestamp("us")))  # pandas 3's
    pq.write_table(table.slice(0, 24), tmp_path / "train.parquet")
    pq.write_table(table.slice(24), tmp_path / "test.parquet")
    assert pq.read_schema(tmp_path / "test.parquet").field("t").type == pa.timestamp("us")
    ingest(
        tmp_path / "train.parquet", tmp_path / "store", entity_col="series_id", time_col="t",
        features=["value"], scaling="none", progress=False,
    )  # fmt: skip
    store = SeriesStore.open(tmp_path / "store")
    holdout = read_holdout(
        tmp_path / "test.parquet", store, entity_col="series_id", time_col="t", value_cols=["value"]
    )
    times, values = holdout[0]
    assert times.tolist() == months[24:].asi8.tolist() and values[:, 0].tolist() == list(
        np.arange(24.0, 30.0)
    )
    assert int(store.series_times(0)[-1]) == months[23].value  # the same unit
    table = pq.read_table(tmp_path / "test.parquet")
    assert time_steps(tmp_path / "test.parquet", table, "t").tolist() == months[24:].asi8.tolist()


def test_holdout_evaluation_keeps_to_the_samplers_labels(tmp_path):
    from metadist.eval.parts import has_labels, holdout_reader
    from metadist.eval.settings import EvalOptions
    from metadist.tasks import build_task_sampler

    def holdout_tasks(store, sampler, units, options):
        tasks = sampler.for_evaluation(
            units,
            split=options.split,
            entity_mask=None if options.labels is None else has_labels(store, options.labels),
            holdout=holdout_reader(store, options),
        )
        return tasks.batches(128, 0), tasks.description, tasks.num_tasks

    # Six series, alternately labelled "yearly" and "monthly", 30 training rows each (the
    # last one only 5: too short for a training task, still evaluated).
    train, test = [], []
    for e in range(6):
        n = 5 if e == 4 else 30
        label = "yearly" if e % 2 == 0 else "monthly"
        train += [(f"s{e}", t, 1.0 + t, label) for t in range(n)]
        test += [(f"s{e}", t, 1.0 + t, label) for t in range(n, n + 3)]
    for path, rows in (("train.parquet", train), ("test.parquet", test)):
        columns = list(zip(*rows, strict=True))
        pq.write_table(
            pa.table(
                {"series_id": columns[0], "t": columns[1], "value": columns[2], "f": columns[3]}
            ),
            tmp_path / path,
        )
    ingest(
        tmp_path / "train.parquet",
        tmp_path / "store",
        entity_col="series_id",
        time_col="t",
        features=["value"],
        label_col="f",
        scaling="none",
        progress=False,
    )
    store = SeriesStore.open(tmp_path / "store")
    options = EvalOptions.from_dict(
        {
            "split": "all",
            "holdout": {
                "path": str(tmp_path / "test.parquet"),
                "entity_col": "series_id",
                "time_col": "t",
            },
        }
    )
    window = {"lookback": 4, "horizon": 3, "num_support": 2, "target_columns": ["value"]}
    for labels, expected in ((["yearly"], ["s0", "s2", "s4"]), (None, [f"s{e}" for e in range(6)])):
        sampler = build_task_sampler("forecast", store, labels=labels, **window)
        batches, _, num_tasks = holdout_tasks(store, sampler, np.arange(sampler.num_units), options)
        entities = sorted(
            str(store.entity_ids[e]) for b in batches for e in b.entity_index.tolist()
        )
        assert num_tasks == len(expected) and entities == expected
    # eval.labels picks among the entities the sampler draws from.
    sampler = build_task_sampler("forecast", store, **window)
    monthly = EvalOptions.from_dict({**options.__dict__, "labels": ["monthly"]})
    batches, _, num_tasks = holdout_tasks(store, sampler, np.arange(sampler.num_units), monthly)
    entities = sorted(str(store.entity_ids[e]) for b in batches for e in b.entity_index.tolist())
    assert num_tasks == 3 and entities == ["s1", "s3", "s5"]
    weekly = EvalOptions.from_dict({**options.__dict__, "labels": ["weekly"]})
    with pytest.raises(ValueError, match="eval.labels: store .* has no label 'weekly'"):
        holdout_tasks(store, sampler, np.arange(sampler.num_units), weekly)
    with pytest.raises(ValueError, match="eval.labels must be a (non-empty )?list"):
        EvalOptions.from_dict({"labels": "monthly"}).validate()


def test_demo_refuses_bad_eval_settings_before_any_work(tmp_path, capsys):
    from metadist import demo

    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), "eval.combinations=[[adapted]]"]) == 1
    assert "two or more different methods" in capsys.readouterr().err
    assert not out.exists()  # no panel generated, no training started
