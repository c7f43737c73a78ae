"""Ensemble members that never saw the evaluated split (`eval.ensemble`).

A member joins the evaluated run's forecasts, so it must hold out what the run holds
out: no unit (entity) of the evaluated split may be one the member trained on or chose
its checkpoint by. Its split is rebuilt from its own config (`trainer.seed`, `data.*`)
as its training built it: a member trained with another seed deals other units to
meta-train, the evaluated run's meta-test ones among them. An evaluation of every unit
(`eval.split=all`, a holdout's protocol: the truth is in no store) has nothing to check.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np

from metadist.train.build import build_task_source
from metadist.train.config import TrainConfig


def unit_keys(sampler: Any, units: np.ndarray) -> np.ndarray:
    """`[n]` sorted store entities of `units` (the unit numbers themselves for a sampler
    whose units are not entities), so that samplers whose units differ (a shorter
    lookback leaves out other short series) compare alike."""
    units = np.asarray(units, dtype=np.int64)
    entities = sampler.unit_entities()
    return np.unique(units if entities is None else np.asarray(entities)[units])


def check_member_held_out(run_dir: Path, member: TrainConfig, held_out: np.ndarray | None) -> None:
    """Refuses a member whose meta-train or meta-val units hold some of `held_out` (the
    evaluated split's `unit_keys`; `None`: every unit is evaluated, nothing to check).

    Raises:
        ValueError: naming the member, how many it saw and the settings to align.
    """
    if held_out is None or len(held_out) == 0:
        return
    with contextlib.redirect_stderr(io.StringIO()):  # the evaluated run printed the notes
        source = build_task_source(member, verify_store=False, notes=False)
    partitioner = source.partitioner
    seen = np.concatenate([partitioner.units("train"), partitioner.units("val")])
    overlap = np.intersect1d(unit_keys(source.sampler, seen), held_out)
    if len(overlap):
        what = "units" if source.sampler.unit_entities() is None else "entities"
        raise ValueError(
            f"eval.ensemble: {run_dir} trained on (or chose its checkpoint by) "
            f"{len(overlap)} of the {len(held_out)} {what} of the evaluated split: its "
            "forecasts have seen their truth. Members must split the data as the evaluated "
            "run does (the same trainer.seed, data.fractions, data.split_by, "
            "data.stratify_by and data.pinned_test_units)"
        )
