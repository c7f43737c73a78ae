"""A benchmark script's results file is replaced whole (`benchmarks/written.py`): a
reader of the previous file never sees it truncated or half rewritten."""

from __future__ import annotations

import json

import pandas as pd
from _benchmark_scripts import run_script


def _competition_data(directory):
    (directory / "competition.yaml").write_text("metric: mape\nstratum_col: null\n")
    rows = [("a", t, float(t), "yearly", 2, 1) for t in range(1, 11)]
    frame = pd.DataFrame(
        rows, columns=["series_id", "t", "value", "frequency", "horizon", "period"]
    )
    frame.to_parquet(directory / "train.parquet")
    (directory / "test.parquet").write_text("never read")


def test_a_results_file_is_replaced_not_rewritten_in_place(tmp_path, monkeypatch):
    _competition_data(tmp_path)
    results = tmp_path / "rows.json"
    results.write_text("the previous run's rows\n")
    with results.open() as reader:  # e.g. a report being read while the benchmark ends
        status, out, err = run_script(
            "origin_bias", [str(tmp_path), "--origins", "2", "--json", str(results)], monkeypatch
        )
        assert (status, err) == (0, "")
        assert reader.read() == "the previous run's rows\n"
    assert [row["origin"] for row in json.loads(results.read_text())] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "competition.yaml",
        "rows.json",
        "test.parquet",
        "train.parquet",
    ]  # no temporary file left


def test_a_missing_results_directory_is_made(tmp_path, monkeypatch):
    _competition_data(tmp_path)
    results = tmp_path / "results" / "origin" / "rows.json"
    status, _, err = run_script(
        "origin_bias", [str(tmp_path), "--origins", "1", "--json", str(results)], monkeypatch
    )
    assert (status, err) == (0, "")
    assert len(json.loads(results.read_text())) == 1


def test_sinusoid_report_without_results_says_so_and_writes_nothing(tmp_path, monkeypatch):
    status, _, err = run_script(
        "sinusoid_reproduction", ["--report", "--out", str(tmp_path)], monkeypatch
    )
    assert status == 1
    assert (
        err.strip() == f"sinusoid_reproduction: --report: no results in {tmp_path} (run it first)"
    )
    assert list(tmp_path.iterdir()) == []
