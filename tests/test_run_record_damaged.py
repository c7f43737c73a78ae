"""A run whose `inference.json` is damaged (a field removed or changed by hand, a copy cut
short) and whose store is gone: loading it, from Python or `metadist forecast`, is one
line naming the file and the field, never a `KeyError` from deep in a forecast.

Real parts: a tiny run trained on an ingested synthetic store, copied elsewhere, its
record edited, the store out of reach.
"""

import json
import shutil
import subprocess
import sys

import pytest
from tiny_runs import tiny_store, train_tiny

import metadist
from metadist.train.artifact import INFERENCE_FILE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A trained run, copied away from its store (the copy cannot find it)."""
    root = tmp_path_factory.mktemp("damaged")
    store = tiny_store(root, num_entities=12, seed=3)
    train_tiny(store, root / "run", "experiment=synthetic_maml")
    moved = root / "elsewhere" / "run"
    shutil.copytree(root / "run", moved)
    shutil.rmtree(root / "store")
    return moved


def edited(run, tmp_path, edit):
    """A copy of `run` whose record `edit` changed."""
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    record = json.loads((copy / INFERENCE_FILE).read_text())
    edit(record)
    (copy / INFERENCE_FILE).write_text(json.dumps(record))
    return copy


def drop(*keys):
    def edit(record):
        part = record
        for key in keys[:-1]:
            part = part[key]
        del part[keys[-1]]

    return edit


def put(value, *keys):
    def edit(record):
        part = record
        for key in keys[:-1]:
            part = part[key]
        part[keys[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (drop("sampler"), "sampler is missing"),
        (drop("shapes", "output_shape"), "shapes.output_shape is missing"),
        (put("x", "shapes", "input_shape"), "shapes.input_shape is 'x', not a list of integers"),
        (put("abc", "sampler", "attributes", "lookback"), "sampler.attributes.lookback is 'abc'"),
        (drop("store", "metadata", "scaling"), "store.metadata.scaling is None"),
        (
            put({"kind": "global", "mean": "x", "std": []}, "store", "metadata", "scaling"),
            "store.metadata.scaling.mean is 'x', not",
        ),
        (drop("store", "metadata", "column_names"), "store.metadata.column_names is None"),
        (put(3, "store", "identity"), "store.identity is 3, not a mapping"),
    ],
)
def test_a_damaged_record_is_named_with_its_field(run, tmp_path, monkeypatch, edit, named):
    copy = edited(run, tmp_path, edit)
    monkeypatch.chdir(tmp_path)
    path = copy / INFERENCE_FILE
    with pytest.raises(FileNotFoundError) as raised:
        metadist.load_run(copy)
    message = str(raised.value)
    assert message.startswith(f"{path} is damaged: {named}")
    assert "\n" not in message and "pass store=PATH" in message


@pytest.mark.timeout(120)
def test_metadist_forecast_names_the_damaged_field_in_one_line(run, tmp_path):
    copy = edited(run, tmp_path, drop("sampler"))
    out = tmp_path / "forecasts.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "forecast", str(copy), "history.parquet"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"metadist forecast: error: {copy / INFERENCE_FILE} is damaged: sampler is missing; "
        f"without it run_dir {copy} needs its store, which is not where its config's "
        "data.store leads: copy the run again, or pass store=PATH (metadist forecast --store "
        "PATH) to load it from its store"
    ]
    assert not out.exists()


def test_an_undamaged_copy_still_forecasts_without_its_store(run, tmp_path, monkeypatch):
    copy = edited(run, tmp_path, lambda record: None)
    monkeypatch.chdir(tmp_path)
    assert metadist.load_run(copy).kind == "forecast"
