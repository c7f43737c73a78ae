"""What evaluating a run scores, rebuilt from its config (`eval_parts`): its store, the
held-out episodes of the evaluated split (confined to it by the sampler's own evaluation
protocol, `TaskSampler.for_evaluation`), the model's shapes, the meta-train units (the
pretrained-embedding baseline's data) and the forecast windows of a learned combination.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadist.batch import MetaBatch
from metadist.data.splits import describe_split
from metadist.eval.holdout import HoldoutReader
from metadist.eval.member_split import unit_keys
from metadist.eval.settings import EvalOptions, check_periods_cover
from metadist.tasks.base import EvaluationTasks
from metadist.tasks.inference import ForecastWindows, forecast_windows
from metadist.train.build import TaskSource, build_task_source
from metadist.train.config import TrainConfig


@dataclass
class EvalParts:
    """What evaluating a run scores: its store, held-out tasks and model shapes.

    Attributes:
        store: the run's open series store, or `None` for samplers that need none.
        tasks: the sampler's evaluation episodes of the evaluated units.
        batches: the tasks as `MetaBatch`es of `eval.batch_size` (seeded by `eval.seed`).
        input_shape: one example's input shape, e.g. `(1,)` or `(L, F)`.
        output_shape: the model's output shape (an embedding's, where `model.output_shape`
            is set).
        task_output_shape: one target's shape as the tasks give it (`(H, T)`, or one
            logit per class).
        description: the tasks as the report names them.
        store_identity: the store's identity the run recorded (`None` without a store).
        train_units: `[U]` the meta-train units of the run's partition (what the
            pretrained-embedding baseline trains on).
        windows: the sampler's forecast windows (`None`: it has none), for the model's
            forecasts of the validation windows (`eval.learned_combination`).
        held_out: the evaluated split's entities (units, for a sampler whose units are
            not entities), which no `eval.ensemble` member may have trained on; `None`
            where every unit is evaluated (`eval.split=all`).
    """

    store: Any
    tasks: EvaluationTasks
    batches: Iterator[MetaBatch]
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    task_output_shape: tuple[int, ...]
    description: str
    store_identity: dict | None = None
    train_units: np.ndarray | None = None
    windows: ForecastWindows | None = None
    held_out: np.ndarray | None = None

    @property
    def target_columns(self) -> list[int] | None:
        """Store column of each forecast target (`None`: tasks scored as sampled)."""
        return self.tasks.target_columns

    @property
    def num_tasks(self) -> int:
        return self.tasks.num_tasks


def eval_parts(
    config: TrainConfig,
    options: EvalOptions,
    recorded_identity: dict | None = None,
    run_dir: Any = "",
    verify_store: bool | None = None,
) -> EvalParts:
    """Store, held-out task batches and model shapes of a run, for evaluation.

    The split is rebuilt exactly as training built it (`DataConfig.partitioner`), and the
    sampler's own evaluation protocol (`TaskSampler.for_evaluation`) says which episodes
    of the split are scored: every example of every episode comes from the split.
    """
    source = build_task_source(
        config,
        verify_store=verify_store,
        notes=False,
        trained_on=(recorded_identity, f"run_dir {run_dir}"),
    )
    store = source.store
    if store is not None:
        check_periods_cover(options, store)
    units = evaluated_units(source, options, config)
    train_units = np.asarray(source.partitioner.units("train"), dtype=np.int64)
    entity_mask = None if options.labels is None else has_labels(store, options.labels)
    holdout = None if options.holdout is None else holdout_reader(store, options)
    tasks = source.sampler.for_evaluation(
        units,
        split=options.split,
        tasks_per_unit=options.tasks_per_unit,
        max_tasks=options.max_tasks,
        seed=options.seed,
        entity_mask=entity_mask,
        train_units=train_units,
        holdout=holdout,
        **options.sampler_options,
    )
    tasks.settings.update(describe_split(source.sampler, store, source.partitioner, config.data))
    if tasks.num_tasks == 0 and options.labels is not None and holdout is None:
        raise ValueError(
            f"eval.labels={options.labels}: none of the {options.split} units has them"
        )
    description = tasks.description
    if options.holdout is not None:
        description += f" from {options.holdout['path']}"
    return EvalParts(
        store=store,
        tasks=tasks,
        batches=tasks.batches(options.batch_size, options.seed),
        input_shape=source.input_shape,
        output_shape=source.output_shape,
        task_output_shape=source.task_output_shape,
        description=description,
        store_identity=recorded_identity,
        train_units=train_units,
        windows=_windows(source, options),
        held_out=None if options.split == "all" else unit_keys(source.sampler, units),
    )


def _windows(source: TaskSource, options: EvalOptions) -> ForecastWindows | None:
    """The sampler's forecast windows where a learned combination needs them."""
    if options.learned_combination is None or source.store is None:
        return None
    try:
        return forecast_windows(source.sampler, source.store.num_columns)
    except ValueError:  # a sampler without the forecasting protocol: no model candidate
        return None


def evaluated_units(source: TaskSource, options: EvalOptions, config: TrainConfig) -> np.ndarray:
    """`[U]` the units of `eval.split` in the run's partition (every unit for `all`).

    Raises:
        ValueError: the split has no units.
    """
    if options.split == "all":
        units = np.arange(source.sampler.num_units, dtype=np.int64)
    else:
        units = np.asarray(source.partitioner.units(options.split), dtype=np.int64)
    if len(units) == 0:
        raise ValueError(
            f"eval.split={options.split!r}: the run's partition has no {options.split} units "
            f"(data.fractions={list(config.data.fractions)})"
        )
    return units


def has_labels(store, labels: list[str]) -> np.ndarray:
    """`[E]` bool: the store's entities with one of `labels` (`ValueError` for unknown ones)."""
    if store is None:
        raise ValueError("eval.labels needs a series store (entities with labels)")
    try:
        return store.has_label(labels)
    except ValueError as error:
        raise ValueError(f"eval.labels: {error}") from None


def holdout_reader(store, options: EvalOptions):
    """The `HoldoutReader` of `eval.holdout`: the sampler reads the columns it forecasts
    (or the spec's `value_cols`) and checks which of its entities the file covers."""
    if store is None:
        raise ValueError("eval.holdout needs a forecast sampler on a series store")
    assert options.holdout is not None  # only called with a holdout
    spec = dict(options.holdout)
    known = {"path", "entity_col", "time_col", "value_cols", "partial"}
    unknown = sorted(set(spec) - known)
    if unknown or "path" not in spec:
        raise ValueError(
            "eval.holdout needs path (and optionally entity_col, time_col, value_cols, "
            f"partial); "
            f"got {sorted(spec)}"
        )
    partial = spec.get("partial", False)
    if not isinstance(partial, bool):  # bool("false") is True: a partial holdout unasked
        raise ValueError(f"eval.holdout.partial must be true or false, got {partial!r}")
    value_cols = spec.get("value_cols")
    if isinstance(value_cols, str):
        value_cols = [value_cols]
    if value_cols is not None and not (
        isinstance(value_cols, (list, tuple))
        and value_cols
        and all(isinstance(c, str) and c for c in value_cols)
    ):
        raise ValueError(
            f"eval.holdout.value_cols must be a list of column names, got {value_cols!r}"
        )
    for key in ("entity_col", "time_col"):
        if key in spec and not (isinstance(spec[key], str) and spec[key]):
            raise ValueError(f"eval.holdout.{key} must be a column name, got {spec[key]!r}")
    if not isinstance(spec["path"], (str, os.PathLike)):
        raise ValueError(f"eval.holdout.path must be a file path, got {spec['path']!r}")
    return HoldoutReader(
        path=str(spec["path"]),
        store=store,
        entity_col=spec.get("entity_col", "entity_id"),
        time_col=spec.get("time_col", store.metadata.get("time_col", "time")),
        value_cols=value_cols,
        partial=partial,
    )
