"""A run's own kept baselines (`<run_dir>/eval/baselines.npz`) are computed afresh by
another version of metadist's source: their keys held only the version number, so an
edited baseline (a Theta fixed, a seasonal test changed) was read back stale."""

import numpy as np
import torch

from metadist.datasets.synthetic import (
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_PERIODS,
    write_synthetic_panel,
)
from metadist.eval import EvalOptions, evaluate_tasks
from metadist.eval import cache as cache_module
from metadist.eval.cache import EvalCache
from metadist.learners import build_learner
from metadist.models import build_model
from metadist.store.ingest import ingest
from metadist.tasks import build_task_sampler

LOOKBACK, HORIZON = 16, 4


def test_kept_baselines_are_computed_afresh_by_other_code(tmp_path, monkeypatch):
    write_synthetic_panel(
        tmp_path / "panel", num_entities=8, length_range=(100, 140), seed=3, nan_fraction=0.0
    )
    store = ingest(tmp_path / "panel", tmp_path / "store", progress=False, **SYNTHETIC_INGEST_ARGS)
    sampler = build_task_sampler(
        "forecast", store, lookback=LOOKBACK, horizon=HORIZON, num_support=3, num_query=1,
        split="end",
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model("forecaster", (LOOKBACK, store.num_columns), (HORIZON, 1))
    learner = build_learner("maml", model, inner_steps=1, inner_lr=0.05)
    units = np.arange(sampler.num_units)
    options = EvalOptions(seasonal_period=dict(SYNTHETIC_PERIODS), scratch_steps=0)

    def evaluate() -> EvalCache:
        kept = EvalCache(tmp_path / "run" / "eval")
        evaluate_tasks(
            learner, [sampler.sample(units, units.astype(np.uint64))], options=options,
            store=store, target_columns=sampler.target_columns, cache=kept,
        )  # fmt: skip
        kept.save()
        return kept

    first = evaluate()
    assert first.computed["statistical forecasts"] == 8 and not first.reused
    assert evaluate().reused["statistical forecasts"] == 8  # the same code: read back
    monkeypatch.setattr(cache_module, "code_fingerprint", lambda: "another source", raising=False)
    edited = evaluate()
    assert not edited.reused and edited.computed["statistical forecasts"] == 8
