"""`benchmarks/fewshot.py` prepares a set's store from what `metadist datasets ucr` prints."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from metadist.datasets.ucr import available_ucr_sets
from metadist.store import SeriesStore

ROOT = Path(__file__).resolve().parents[1]


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "fewshot_bench", ROOT / "benchmarks" / "fewshot.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["fewshot_bench"] = module
    spec.loader.exec_module(module)
    return module


def test_prepare_ingests_with_the_next_line_not_the_then_hint(tmp_path):
    # the summary's last line is a `then: metadist train ...` hint; the ingest is on `next:`
    installed = available_ucr_sets()
    if not installed:
        pytest.skip("the `ucr` extra (sktime or aeon) is not installed")
    name = "ItalyPowerDemand" if "ItalyPowerDemand" in installed else installed[0]
    store = _benchmark().prepare(name, tmp_path)
    assert store == tmp_path / "data" / name / "store"
    assert SeriesStore.open(store).num_entities > 0
