"""The tasks an evaluation has done, shown while it runs, with a learned combination too
(whose tasks are scored only once every validation window is in, after its weights'
fits, which show their own progress)."""

import numpy as np
import pytest
import torch

from metadist import progress
from metadist.datasets.synthetic import (
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_PERIODS,
    write_synthetic_panel,
)
from metadist.eval import EvalOptions, evaluate_tasks
from metadist.learners import build_learner
from metadist.models import build_model
from metadist.store.ingest import ingest
from metadist.tasks import build_task_sampler

LOOKBACK, HORIZON = 16, 4


@pytest.mark.parametrize("learned", [None, ["theta", "naive"]])
def test_evaluating_counts_every_task_done(tmp_path, monkeypatch, capsys, learned):
    write_synthetic_panel(
        tmp_path / "panel", num_entities=16, length_range=(100, 140), seed=3, nan_fraction=0.0
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
    batches = [sampler.sample(part, part.astype(np.uint64)) for part in (units[:9], units[9:])]
    options = EvalOptions(
        seasonal_period=dict(SYNTHETIC_PERIODS), scratch_steps=0, learned_combination=learned
    )
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    result, _ = evaluate_tasks(
        learner, batches, options=options, store=store, target_columns=sampler.target_columns,
        progress=True, num_tasks=16,
    )  # fmt: skip
    assert result["num_tasks"] == 16
    lines = capsys.readouterr().err.splitlines()
    evaluating = [line for line in lines if line.startswith("evaluating: ")]
    # it said 0/16 to the end where the learned combination held the tasks back
    assert evaluating[0].startswith("evaluating: 9/16 tasks"), lines
    assert evaluating[-1].startswith("evaluating: 16/16 tasks (100%)"), lines
    # the weights' fits after the last task: 2 losses x 6 penalties on a split of the
    # 16 validation series, then the one chosen on all (they were silent)
    fits = [line for line in lines if line.startswith("learned combination: ")]
    assert bool(fits) == (learned is not None), lines
    if learned is not None:
        assert fits[-1].startswith("learned combination: 13/13 fits (100%)"), lines
