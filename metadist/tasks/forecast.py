"""Forecasting tasks: one entity (or one time chunk of it) and a split time tau.

Row offsets below are relative to a unit's first row. With lookback L, horizon H and
stride s, a window starting at row w has inputs at rows [w, w+L) and targets at rows
[w+L, w+L+H). For a split row tau:

- support: the K windows w_k = tau - L - H - (K-1-k)·s, k = 0..K-1, whose whole target span
  ends before tau (the last one ends right at tau);
- query: the Q windows w_j = tau - L + j·s, j = 0..Q-1, whose targets start at or after tau
  (their inputs reach back before tau: that is the observable past).

So a unit of n rows needs n ≥ L + 2H + (K+Q-2)·s; tau ranges over
[L + H + (K-1)·s, n - H - (Q-1)·s], uniformly at random, or is the last value of that range
with `split="end"` (the evaluation protocol: adapt on the history, forecast the last H
steps with Q=1). With `pad_inputs=P`, the first P input rows of a window may lie before
the unit's first row and repeat its first value (as forecasting competitions pad short
series), which lowers both bounds by P. With `recent_splits=R`, a random tau is drawn
from the last R values of its range only (all of it when the range is shorter): training
tasks then come from the recent past of every series, as N-BEATS' history limit does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from metadist.batch import MetaBatch, TaskSet
from metadist.options import Configurable
from metadist.tasks.base import (
    EvaluationTasks,
    TaskSampler,
    random_subset,
    repeated_unit_tasks,
)
from metadist.tasks.forecast_options import ForecastOptions
from metadist.tasks.holdout import holdout_batches
from metadist.tasks.options import resolve_columns
from metadist.tasks.registry import register_task_sampler
from metadist.tasks.series_end import SeriesEndWindows
from metadist.tasks.windows import WindowGatherer


@register_task_sampler("forecast")
class ForecastSampler(TaskSampler, Configurable):
    """Few-shot forecasting episodes from a series store.

    Args:
        store: an open `SeriesStore`.
        options: the sampler's `ForecastSampler.Options` (`ForecastOptions`, in
            `metadist.tasks.forecast_options`), or give its fields as keywords
            (`ForecastSampler(store, lookback=32, horizon=8)`); kept as `self.options`.
        **keywords: the options' fields, instead of `options`.

    Shapes: `support.x [B, K, L, F]`, `support.y [B, K, H, T]`, `query.x [B, Q, L, F]`,
    `query.y [B, Q, H, T]` (float32, contiguous); `entity_index`, `stratum`, `split_time`
    `[B]` int64, `split_time` being the store time of row tau.

    Attributes:
        entities: `[E']` store indices of the entities the sampler draws from (those with
            one of `labels`; all of them without), long enough for a task or not.
        num_excluded_entities: of those, the entities too short for a single task (left
            out).
        excluded_entities: `[num_excluded_entities]` their store indices.
        unit_entity: `[num_units]` int64 entity (store index) of every unit.
        unit_start: `[num_units]` int64 first store row of every unit.
        unit_length: `[num_units]` int64 number of rows of every unit.

    Raises:
        ValueError: L, H, K, Q or stride < 1; unknown columns; a bad split/unit; a
            chunk_length that cannot hold one task; or no entity long enough for a task.
    """

    Options = ForecastOptions  # the options and their checks: metadist.tasks.forecast_options

    needs_store = True
    training_only_options = ("split", "num_query", "recent_splits", "labels")
    ensemble_may_shorten_lookback = True

    def __init__(
        self, store: Any, *, options: ForecastOptions | None = None, **keywords: Any
    ) -> None:
        self.options: ForecastOptions = self.read_options(keywords, options)
        opts = self.options
        self.store = store
        self.lookback, self.horizon = int(opts.lookback), int(opts.horizon)
        self.num_support, self.num_query = int(opts.num_support), int(opts.num_query)
        self.stride, self.pad_inputs = int(opts.stride), int(opts.pad_inputs)
        self.split, self.unit = opts.split, opts.unit
        self.recent_splits = None if opts.recent_splits is None else int(opts.recent_splits)
        self.chunk_length = None if opts.chunk_length is None else int(opts.chunk_length)
        columns = store.column_names if opts.input_columns is None else opts.input_columns
        self.input_columns = resolve_columns(store, columns, "input_columns")
        self.target_columns = resolve_columns(
            store, _target_names(store, opts.target_columns), "target_columns"
        )
        selected = self._select_labels(store, opts.labels)
        self.entities = np.flatnonzero(selected)
        kept = self._long_enough(store, selected)
        self.unit_entity, self.unit_start, self.unit_length = _units(store, kept, self.chunk_length)
        self._unit_strata = np.asarray(store.stratum_codes, dtype=np.int64)[self.unit_entity]
        self._gatherers: tuple[WindowGatherer, WindowGatherer] | None = None
        self._times: np.ndarray | None = None

    def _select_labels(self, store: Any, labels: Sequence[str] | str | None) -> np.ndarray:
        """`[E]` bool: the entities whose label is in `labels` (all with None)."""
        if labels is None:
            self.labels: list[str] | None = None
            return np.ones(store.num_entities, dtype=bool)
        self.labels = [labels] if isinstance(labels, str) else [str(x) for x in labels]
        try:
            return store.has_label(self.labels)
        except ValueError as error:
            raise ValueError(f"forecast sampler: labels: {error}") from None

    def _long_enough(self, store: Any, selected: np.ndarray) -> np.ndarray:
        """Store indices of the `selected` entities long enough for a task; the others are
        `excluded_entities`.

        Raises:
            ValueError: none is long enough (naming the longest and what a task needs).
        """
        need = self.rows_per_task
        lengths = np.asarray(store.lengths, dtype=np.int64)
        fits = (lengths >= need) & selected
        if not fits.any():
            chosen = f" with label {', '.join(self.labels)}" if self.labels else ""
            raise ValueError(
                f"forecast sampler: no entity{chosen} of store {store.path} is long enough for "
                "one task, "
                f"which needs {self._need_text()} = {need} rows; the longest entity has "
                f"{int(lengths[selected].max()) if selected.any() else 0}: lower lookback, horizon, "
                "num_support, num_query or stride"
            )
        self.excluded_entities = np.flatnonzero(selected & ~fits)
        return np.flatnonzero(fits)

    @property
    def rows_per_task(self) -> int:
        """Fewest rows a unit needs: L + 2H + (K + Q - 2)·stride - pad_inputs."""
        return self.options.rows_per_task

    def _need_text(self) -> str:
        return self.options.need_text()

    @property
    def num_excluded_entities(self) -> int:
        return int(len(self.excluded_entities))

    @property
    def num_units(self) -> int:
        return int(len(self.unit_entity))

    def unit_strata(self) -> np.ndarray:
        return self._unit_strata

    def unit_entities(self) -> np.ndarray:
        return self.unit_entity

    def for_evaluation(
        self,
        units: np.ndarray,
        *,
        split: str = "test",
        tasks_per_unit: int = 1,
        max_tasks: int | None = None,
        seed: int = 0,
        entity_mask: np.ndarray | None = None,
        train_units: np.ndarray | None = None,
        holdout: Any = None,
        **options: Any,
    ) -> EvaluationTasks:
        """The forecasting protocol: adapt on each unit's history, forecast its last H rows.

        Each evaluated unit gives one task with `split="end"` and one query window (its
        targets are the unit's last H rows, its support the K windows before them);
        `options` replace sampler options for evaluation. With a `holdout`
        reader (`metadist.eval.holdout.HoldoutReader`: `read(target names)` gives
        `{entity: (times, values)}`, `cover(values, entities)` the entities it covers),
        the query targets are the holdout values instead
        and the support the most recent windows of the whole stored series
        (`metadist.tasks.holdout`); with `split="all"` every drawn entity that has a
        holdout is scored, also those too short for a training task.

        Raises:
            ValueError: `tasks_per_unit` > 1 (these tasks are not random), options the
                sampler rejects, or units the evaluation sampler does not keep.
        """
        if tasks_per_unit != 1:
            raise ValueError(
                "eval.tasks_per_unit must be 1 for the forecast sampler: its evaluation task "
                f"of a unit (split=end) is always the same, got {tasks_per_unit}"
            )
        units = self.units_of_entities(units, entity_mask)
        if holdout is not None:
            return self._holdout_tasks(units, split, holdout, entity_mask, max_tasks, seed, options)
        evaluated = self.with_options(**{"split": "end", "num_query": 1, **options})
        assert isinstance(evaluated, ForecastSampler)  # with_options rebuilds this class
        return repeated_unit_tasks(
            evaluated,
            evaluated.same_units(self, units),
            split=split,
            target_columns=evaluated.target_columns,
            note=" (split=end: adapt on the history, forecast the last H)",
            max_tasks=max_tasks,
            seed=seed,
        )

    def same_units(self, other: ForecastSampler, units: np.ndarray) -> np.ndarray:
        """This sampler's indices of `other`'s `units`, matched by their first store row.

        Options can change which entities a sampler keeps (a task needs fewer rows with
        one query window).

        Raises:
            ValueError: a unit of `other` this sampler does not keep.
        """
        wanted = np.asarray(other.unit_start)[units]
        order = np.argsort(self.unit_start, kind="stable")
        found = np.minimum(np.searchsorted(self.unit_start[order], wanted), len(order) - 1)
        matched = order[found]
        if not np.array_equal(self.unit_start[matched], wanted):
            raise ValueError("the evaluation sampler does not keep every held-out unit")
        return matched.astype(np.int64)

    def _holdout_tasks(
        self, units, split, holdout, entity_mask, max_tasks, seed, options
    ) -> EvaluationTasks:
        if options:
            raise ValueError(
                "eval.sampler_options cannot be combined with eval.holdout (the holdout "
                f"tasks use the run's own windows), got {sorted(options)}"
            )
        values = holdout.read([self.store.column_names[c] for c in self.target_columns])
        if split == "all":
            # Every entity the sampler draws from (e.g. one label), also those too short
            # for a training task.
            entities = np.unique(self.entities)
            if entity_mask is not None:
                entities = entities[np.asarray(entity_mask, dtype=bool)[entities]]
        else:
            entities = np.unique(self.unit_entity[units])
        entities, num_left_out = holdout.cover(values, entities)
        entities = random_subset(entities, max_tasks, seed)

        def batches(batch_size: int, seed: int = 0) -> Iterator[MetaBatch]:
            return holdout_batches(
                self.store,
                values,
                entities=entities,
                lookback=self.lookback,
                horizon=self.horizon,
                num_support=self.num_support,
                stride=self.stride,
                input_columns=self.input_columns,
                target_columns=self.target_columns,
                batch_size=batch_size,
            )

        return EvaluationTasks(
            num_tasks=len(entities),
            description=(
                f"{len(entities)} entities"
                + (f", {num_left_out} without a holdout left out" if num_left_out else "")
                + f", query = the holdout (adapt on up to {self.num_support} windows of the "
                "training part)"
            ),
            batches=batches,
            target_columns=list(self.target_columns),
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # views of the memory maps; rebuilt after unpickling (pickling them would copy)
        state["_gatherers"] = None
        state["_times"] = None
        return state

    def _store_times(self) -> np.ndarray:
        """The store's time column (a plain view, set up with the windows)."""
        self._windows()
        assert self._times is not None
        return self._times

    @property
    def end_windows(self) -> SeriesEndWindows:
        """A task's K support windows ending at its split row and its query windows from
        there (inputs padded by up to `pad_inputs` rows)."""
        return SeriesEndWindows(
            self.lookback,
            self.horizon,
            self.num_support,
            self.stride,
            padding="inputs",
            pad_inputs=self.pad_inputs,
        )

    def _windows(self) -> tuple[WindowGatherer, WindowGatherer]:
        if self._gatherers is None:
            values = self.store.values
            self._times = np.asarray(self.store.times)  # plain view: cheaper to index
            self._gatherers = (
                WindowGatherer(values, self.input_columns, self.lookback),
                WindowGatherer(values, self.target_columns, self.horizon),
            )
        return self._gatherers

    def split_rows(self, units: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        """`[B]` int64 split row tau of each task, relative to its unit's first row.

        Random tau is uniform over the valid range (its last `recent_splits` values), drawn from the top 53 bits of the
        task seed itself (task seeds are already well mixed; one draw per task does not
        need the counter-based `task_uniform`).
        """
        low = self.end_windows.rows_needed
        high = self.unit_length[units] - self.horizon - (self.num_query - 1) * self.stride
        if self.split == "end":
            return high
        if self.recent_splits is not None:
            low = np.maximum(low, high - self.recent_splits + 1)
        u = (np.asarray(seeds, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        return low + np.minimum((u * (high - low + 1)).astype(np.int64), high - low)

    def unit_rows(self) -> tuple[np.ndarray, np.ndarray]:
        return self.unit_start, self.unit_length

    def task_rows(self, units: np.ndarray, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(first_row [B], end_row [B])`: from the first support input row (padding
        clipped to the unit) to the last query target row, plus one."""
        units = np.asarray(units, dtype=np.int64)
        base = self.unit_start[units] + self.split_rows(units, seeds)
        first = self.end_windows.support_starts(base)[:, 0]
        # the last query window's first target row
        last = self.end_windows.query_starts(base, self.num_query)[:, -1] + self.lookback
        return np.maximum(first, self.unit_start[units]), last + self.horizon

    def sample(self, units: np.ndarray, seeds: np.ndarray) -> MetaBatch:
        units = np.asarray(units, dtype=np.int64)
        inputs, targets = self._windows()
        tau = self.split_rows(units, seeds)
        base = self.unit_start[units] + tau  # store row of tau
        windows = self.end_windows
        support_start = windows.support_starts(base)  # [B, K]
        query_start = windows.query_starts(base, self.num_query)  # [B, Q]
        entity = self.unit_entity[units]
        first_row = self.unit_start[units][:, None]
        support_x = windows.inputs(inputs, support_start, first_row)
        query_x = windows.inputs(inputs, query_start, first_row)
        return MetaBatch(
            support=TaskSet(
                torch.from_numpy(support_x),
                torch.from_numpy(windows.targets(targets, support_start, first_row)),
            ),
            query=TaskSet(
                torch.from_numpy(query_x),
                torch.from_numpy(windows.targets(targets, query_start, first_row)),
            ),
            entity_index=torch.from_numpy(entity),
            stratum=torch.from_numpy(self._unit_strata[units]),
            split_time=torch.from_numpy(self._store_times()[base]),
        )


def _target_names(store: Any, target_columns: Sequence[str] | None) -> Sequence[str]:
    """The columns to forecast: `target_columns`, or the store's targets.

    Raises:
        ValueError: neither names any (a store without target columns).
    """
    if target_columns is not None:
        return target_columns
    if not store.target_names:
        raise ValueError(
            f"store {store.path} has no target columns; set target_columns to some of "
            f"{store.column_names}"
        )
    return store.target_names


def _units(
    store: Any, kept: np.ndarray, chunk_length: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(unit_entity, unit_start, unit_length)`, each `[num_units]` int64: one unit per
    entity of `kept`, or (with `chunk_length`) one per `chunk_length` rows of each, the
    last chunk of an entity taking the remainder."""
    lengths = np.asarray(store.lengths, dtype=np.int64)
    starts = np.asarray(store.starts, dtype=np.int64)
    if chunk_length is None:
        return kept, starts[kept], lengths[kept]
    num_chunks = np.maximum(lengths[kept] // chunk_length, 1)
    unit_entity = np.repeat(kept, num_chunks)
    first_unit = np.concatenate(([0], np.cumsum(num_chunks)[:-1]))
    chunk_number = np.arange(len(unit_entity)) - np.repeat(first_unit, num_chunks)
    unit_start = starts[unit_entity] + chunk_number * chunk_length
    is_last = chunk_number == np.repeat(num_chunks, num_chunks) - 1
    entity_end = starts[unit_entity] + lengths[unit_entity]
    unit_length = np.where(is_last, entity_end - unit_start, chunk_length).astype(np.int64)
    return unit_entity, unit_start, unit_length
