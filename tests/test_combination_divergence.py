"""A forecast combination with a diverged member is reported as diverged on that task:
its mean had the member's exploding forecast averaged in, and read as a number whenever
the mean itself stayed under the divergence bound."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metadist.eval import EvalOptions
from metadist.eval.forecast_scoring import ForecastScorer
from metadist.eval.settings import FORECAST_METRICS
from metadist.eval.task_scores import DIVERGENCE_FACTOR, TaskScores, overall_summary
from metadist.store import SeriesStore
from metadist.store.ingest import ingest
from metadist.tasks import build_task_sampler

LOOKBACK, HORIZON = 8, 4


def test_a_combination_with_a_diverged_member_is_diverged(tmp_path):
    names = ["A", "B", "C"]
    rows = {
        "entity_id": [n for n in names for _ in range(60)],
        "time": [t for _ in names for t in range(60)],
        "y": [10.0 + (t % 7) + i for i, _ in enumerate(names) for t in range(60)],
    }
    pq.write_table(pa.table(rows), tmp_path / "panel.parquet")
    ingest(
        tmp_path / "panel.parquet", tmp_path / "store", entity_col="entity_id", time_col="time",
        features=["y"], targets=["y"], scaling="none", progress=False,
    )  # fmt: skip
    store = SeriesStore.open(tmp_path / "store")
    sampler = build_task_sampler(
        "forecast", store, lookback=LOOKBACK, horizon=HORIZON, num_support=2, num_query=1,
        split="end",
    )  # fmt: skip
    units = np.arange(sampler.num_units)
    batch = sampler.sample(units, units.astype(np.uint64))
    combination = ["adapted", "theta"]
    options = EvalOptions(combinations=[combination], num_examples=0)
    methods = [
        "adapted",
        "unadapted",
        "naive",
        "seasonal_naive",
        "naive2",
        "theta",
        "adapted+theta",
    ]
    scores = TaskScores(methods, FORECAST_METRICS)
    scorer = ForecastScorer(store, sampler.target_columns, options, methods)
    truth = batch.query.y.numpy()
    # the first task's adapted forecast explodes: 1.5e6 times its history's largest value
    # (diverged), which the mean with Theta halves to under the bound
    largest = max(float(np.abs(store.series(int(e))[:, 0]).max()) for e in batch.entity_index)
    adapted = truth.copy()
    adapted[0] = 1.5 * DIVERGENCE_FACTOR * largest
    try:
        scorer(scores, batch, {"adapted": adapted, "unadapted": truth.copy()})
    finally:
        scorer.close()
    assert scores.diverged["adapted"] == [True, False, False]
    assert scores.diverged["adapted+theta"] == [True, False, False]
    overall = overall_summary(scores, classification=False)
    assert overall["adapted+theta"]["smape"]["num_diverged"] == 1
    assert np.isnan(overall["adapted+theta"]["smape"]["value"])
    assert not scores.diverged["theta"][0]
