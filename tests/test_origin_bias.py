"""`benchmarks/origin_bias.py`: seasonal naive and drift scored origin by origin on a
competition's training part alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location(
        "origin_bias", ROOT / "benchmarks" / "origin_bias.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_origin_scores_the_window_before_it_from_the_values_before_that(tmp_path):
    (tmp_path / "competition.yaml").write_text("metric: mape\nstratum_col: null\n")
    rows = [("a", t, float(t), "yearly", 2, 1) for t in range(1, 11)]  # 1..10, steps of 1
    frame = pd.DataFrame(
        rows, columns=["series_id", "t", "value", "frequency", "horizon", "period"]
    )
    frame.to_parquet(tmp_path / "train.parquet")
    (tmp_path / "test.parquet").write_text("never read")
    table = _module().origin_table(tmp_path, 2)
    first, second = table
    assert (first["origin"], second["origin"], first["series"]) == (1, 2, 1)
    # origin 1: 9, 10 from 1..8; seasonal naive 8, 8; drift (mean step 1) 9, 10 exactly
    expected = 100 * np.mean([1 / 9, 2 / 10])
    assert first["seasonal_naive"]["mape"] == pytest.approx(expected)
    assert first["seasonal_naive"]["signed"] == pytest.approx(-expected)
    assert first["drift"]["mape"] == pytest.approx(0.0)
    # origin 2: 7, 8 from 1..6
    assert second["seasonal_naive"]["mape"] == pytest.approx(100 * np.mean([1 / 7, 2 / 8]))
