"""`combine_runs` pools evaluations of one split only: meta-val and meta-test scores are
not the same quantity."""

import numpy as np
import pytest
import torch

from metadist.datasets.synthetic import (
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_PERIODS,
    write_synthetic_panel,
)
from metadist.eval import EvalOptions, evaluate_tasks
from metadist.eval.combine import combine_runs
from metadist.eval.report import write_report
from metadist.learners import build_learner
from metadist.models import build_model
from metadist.store.ingest import ingest
from metadist.tasks import build_task_sampler

LOOKBACK, HORIZON = 16, 4


def _evaluate_parts(root, splits):
    """Writes one evaluation per `(name, split)`, each of other series of one store."""
    write_synthetic_panel(
        root / "panel", num_entities=12, length_range=(100, 140), seed=3, nan_fraction=0.0
    )
    store = ingest(root / "panel", root / "store", progress=False, **SYNTHETIC_INGEST_ARGS)
    sampler = build_task_sampler(
        "forecast", store, lookback=LOOKBACK, horizon=HORIZON, num_support=3, num_query=1,
        split="end",
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model("forecaster", (LOOKBACK, store.num_columns), (HORIZON, 1))
    learner = build_learner("maml", model, inner_steps=1, inner_lr=0.05)
    parts = np.array_split(np.arange(sampler.num_units), len(splits))
    for (name, split), part in zip(splits, parts, strict=True):
        options = EvalOptions(
            seasonal_period=dict(SYNTHETIC_PERIODS), scratch_steps=0, num_examples=0, split=split
        )
        result, _ = evaluate_tasks(
            learner, [sampler.sample(part, part.astype(np.uint64))], options=options,
            store=store, target_columns=sampler.target_columns,
        )  # fmt: skip
        write_report(result, root / name)


def test_runs_evaluated_on_different_splits_are_not_pooled(tmp_path):
    _evaluate_parts(tmp_path, [("a", "test"), ("b", "val"), ("c", "test")])
    with pytest.raises(ValueError, match=r"eval.split='val'.* on eval.split='test'"):
        combine_runs([tmp_path / "a", tmp_path / "b"])
    pooled = combine_runs([tmp_path / "a", tmp_path / "c"])
    assert pooled["num_tasks"] == 8 and pooled["settings"]["split"] == "test"
    # a combine's output records the split, so it is checked when pooled again
    (tmp_path / "ac").mkdir()
    write_report(pooled, tmp_path / "ac", directory=tmp_path / "ac")
    with pytest.raises(ValueError, match="only evaluations of the same split"):
        combine_runs([tmp_path / "ac", tmp_path / "b"])
