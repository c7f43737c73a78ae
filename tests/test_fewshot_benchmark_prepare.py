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


def _tasks(run: Path, correct: list[int], pretrained: list[int], points: int = 5) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (run / "eval").mkdir(parents=True)
    columns = {
        "num_points": [points] * len(correct),
        "adapted:accuracy": [float(c) for c in correct],
        "pretrained:accuracy": [float(c) for c in pretrained],
    }
    pq.write_table(pa.table(columns), run / "eval" / "tasks.parquet")
    return run


def test_seed_mean_pairs_each_seed_with_its_own_baseline(tmp_path):
    bench = _benchmark()
    runs = [
        _tasks(tmp_path / "s0", [5, 4, 3, 2], [3, 3, 3, 3]),  # 0.7 against 0.6
        _tasks(tmp_path / "s1", [2, 2, 2], [3, 3, 3]),  # 0.4 against 0.6, other episodes
    ]
    text = bench.seed_mean(runs)
    assert text.startswith("mean 0.550 over 2 seeds (0.700, 0.400)")
    # seven episodes' differences, each against its own seed's pretrained embedding
    differences = [0.4, 0.2, 0.0, -0.2, -0.2, -0.2, -0.2]
    assert f"− pretrained, each seed paired: {sum(differences) / 7:+.3f} ± 0." in text
