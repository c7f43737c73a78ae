"""The Python path of a notebook: `metadist.ingest` → `metadist.fit` → the `Run`.

Real parts: a small panel of noisy sinusoids written as Parquet here, ingested by
`metadist.ingest`, meta-trained and evaluated in-process by `metadist.fit`.
"""

import inspect
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import metadist
from metadist.store import SeriesStore
from metadist.train import load_config

pytestmark = pytest.mark.integration
H = 8  # the synthetic_maml sampler's horizon
NUM_ENTITIES, LENGTH = 16, 120
TINY = [
    "trainer.meta_steps=3",
    "trainer.meta_batch_size=4",
    "trainer.checkpoint_every=3",
    "trainer.eval_every=0",
    "logging.wandb.mode=disabled",
    "eval.scratch_steps=0",
    "eval.seasonal_period=12",
    "eval.group_by=[]",
]


def _write_panel(path):
    """Long-format Parquet: one row per (sensor, t), a noisy sinusoid per sensor."""
    rng = np.random.default_rng(0)
    t = np.tile(np.arange(LENGTH), NUM_ENTITIES)
    sensor = np.repeat([f"s{i:02d}" for i in range(NUM_ENTITIES)], LENGTH)
    phase = np.repeat(rng.uniform(0, 2 * np.pi, NUM_ENTITIES), LENGTH)
    load = 10 + 3 * np.sin(2 * np.pi * t / 12 + phase) + rng.normal(0, 0.1, t.size)
    table = pa.table({"sensor": sensor, "t": t, "load": load, "temp": np.cos(t / 5.0)})
    pq.write_table(table, path)
    return table


def _ingest(panel, out, **changes):
    args = dict(entity_col="sensor", time_col="t", features=["temp", "load"], targets=["load"])
    return metadist.ingest(panel, out, progress=False, **{**args, **changes})


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("notebook")
    table = _write_panel(tmp / "panel.parquet")
    store = _ingest(tmp / "panel.parquet", tmp / "store", scaling="per-entity")
    run = metadist.fit(
        "synthetic_maml", [f"data.store={store.path}", *TINY], run_dir=tmp / "run", progress=False
    )
    return {"tmp": tmp, "table": table, "store": store, "run": run}


def test_import_metadist_imports_no_torch():
    code = (
        "import sys, metadist\n"
        "assert {'fit', 'ingest', 'load_run'} <= set(dir(metadist))\n"
        "metadist.ingest\n"  # the store alone: numpy and pyarrow
        "assert 'torch' not in sys.modules and 'pandas' not in sys.modules\n"
        "import metadist.train\n"
        "assert metadist.fit is not metadist.train and callable(metadist.train.train)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_ingest_returns_the_opened_store(fitted):
    store = fitted["store"]
    assert isinstance(store, SeriesStore)
    assert store.num_entities == NUM_ENTITIES
    assert store.column_names == ["temp", "load"]
    assert store.metadata["source"]["num_rows_read"] == NUM_ENTITIES * LENGTH


def test_fit_returns_the_trained_run_evaluated(fitted):
    run = fitted["run"]
    assert isinstance(run, metadist.api.Run) and run.kind == "forecast"
    assert run.run_dir == fitted["tmp"] / "run"
    assert run.config.trainer.meta_steps == 3 and run.config.logging.progress is False
    metrics = json.loads((run.run_dir / "eval" / "metrics.json").read_text())
    assert metrics["num_tasks"] >= 1
    loaded = metadist.load_run(run.run_dir)  # what fit returned is what load_run gives
    for name, value in loaded.learner.state_dict().items():
        torch.testing.assert_close(value, run.learner.state_dict()[name])


def test_the_fitted_run_forecasts_a_pandas_history(fitted):
    frame = fitted["table"].to_pandas()
    history = frame[frame["sensor"] == "s03"].iloc[: LENGTH - H]
    forecasts = fitted["run"].forecast(history).to_pandas()
    assert isinstance(forecasts, pd.DataFrame)
    assert forecasts["step"].tolist() == list(range(1, H + 1))
    assert forecasts["t"].tolist() == list(range(LENGTH - H, LENGTH))
    assert np.isfinite(forecasts["load"]).all()


def test_fit_takes_a_config_instead_of_overrides(tmp_path):
    config = load_config(
        ["experiment=sinusoid_maml", "trainer.meta_steps=2", "trainer.eval_every=0"]
    )
    run = metadist.fit(config=config, run_dir=tmp_path / "sin", evaluate=False, progress=False)
    assert run.kind == "other" and run.config.trainer.meta_steps == 2
    assert not (tmp_path / "sin" / "eval").exists()
    # the same call again resumes the finished run: no step more, no checkpoint more
    before = sorted(p.name for p in (tmp_path / "sin" / "checkpoints").iterdir())
    again = metadist.fit(config=config, run_dir=tmp_path / "sin", evaluate=False, progress=False)
    assert sorted(p.name for p in (tmp_path / "sin" / "checkpoints").iterdir()) == before
    assert "step_00000002.pt" in before
    for name, value in again.learner.state_dict().items():
        torch.testing.assert_close(value, run.learner.state_dict()[name])


@pytest.mark.parametrize(
    "call,field",
    [
        (lambda tmp: _ingest(tmp / "panel.parquet", tmp / "s", min_length=0), "--min-length"),
        (lambda tmp: _ingest(tmp / "panel.parquet", tmp / "s", scaling="log"), "--scaling"),
        (lambda tmp: _ingest(tmp / "panel.parquet", tmp / "s", features=["lod"]), "lod"),
        # a wrong type is named too, as the argument it is (it was a TypeError naming none)
        (lambda tmp: _ingest(3, tmp / "s"), "^src must be a path"),
        (lambda tmp: _ingest(tmp / "panel.parquet", None), "^out must be a path"),
        (lambda tmp: _ingest(tmp / "panel.parquet", tmp / "s", features=3), "^features"),
        (lambda tmp: _ingest(tmp / "panel.parquet", tmp / "s", workers=2.5), "^workers"),
        (
            lambda tmp: _ingest(tmp / "panel.parquet", tmp / "s", memory_limit_mb="big"),
            "^memory_limit_mb must be an integer",
        ),
        (lambda tmp: metadist.fit("sinusoid_maml", run_dir=3), "^run_dir must be a path"),
        (lambda tmp: metadist.fit("sinusoid_maml", config_dir=3), "^config_dir must be a path"),
        (
            lambda tmp: metadist.fit("sinusoid_maml", ["trainer.meta_steps=1"], evaluate="no"),
            "^evaluate must be True or False",
        ),
        (lambda tmp: metadist.fit("sinusoid_maml", "trainer.meta_steps=2"), "overrides"),
        (lambda tmp: metadist.fit("sinusoid_maml", ["trainer.meta_stepz=2"]), "meta_stepz"),
        (lambda tmp: metadist.fit("sinusoid_maml", ["trainer.meta_steps=0"]), "meta_steps"),
        (lambda tmp: metadist.fit("sinusoid_maml", ["eval.max_tasks=0"]), "max_tasks"),
        (lambda tmp: metadist.fit("sinusoid_maml", progress="yes"), "progress"),
        (lambda tmp: metadist.fit("sinusoid_maml", config={}), "config"),
        (lambda tmp: metadist.fit(3), "experiment"),
    ],
)
def test_a_bad_argument_is_a_value_error_naming_it(tmp_path, monkeypatch, call, field):
    _write_panel(tmp_path / "panel.parquet")
    monkeypatch.chdir(tmp_path)  # a run directory would appear here: none must
    with pytest.raises(ValueError, match=field):
        call(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["panel.parquet"]


def test_column_lists_and_integers_of_a_notebook_are_taken(tmp_path):
    """What the type checks must not refuse: `df.columns[...]` (a pandas Index) and numpy
    integers, as ingest read them before the checks."""
    table = _write_panel(tmp_path / "panel.parquet")
    columns = pd.Index(table.column_names)
    store = _ingest(
        tmp_path / "panel.parquet", tmp_path / "s", features=columns[2:], targets=columns[2:3],
        min_length=np.int64(2), memory_limit_mb=np.int32(64),
    )  # fmt: skip
    assert store.column_names == ["load", "temp"]


def test_metadist_train_stays_the_training_subpackage():
    assert inspect.ismodule(metadist.train) and metadist.train.train is not metadist.fit
