"""N-way K-shot classification episodes over the entities of a store.

The classes are entity labels (or strata). A task drawn from unit (entity) u takes u's
class and N-1 other classes, then K support and Q query examples per class, each example
a window of `lookback` rows (or the whole series) of a *different* entity of that class, so
no entity is in both the support and the query set. Class indices are remapped to 0..N-1
in a random order per task — what torchmeta's `ClassSplitter` and learn2learn's
`NWays`/`KShots` transforms did.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from metadist.batch import MetaBatch, TaskSet
from metadist.tasks._windows import WindowGatherer
from metadist.tasks.base import TaskSampler, register_task_sampler, task_uniform
from metadist.tasks.forecast import _positive, _resolve_columns


@register_task_sampler("nway_kshot")
class NWayKShotSampler(TaskSampler):
    """N-way K-shot classification of series windows by entity label or stratum.

    Args:
        store: an open `SeriesStore` (with a label or stratum column).
        num_ways: N classes per task.
        num_shots: K support examples per class.
        num_query: Q query examples per class.
        class_by: "label" or "stratum": which entity attribute is the class.
        lookback: L, rows per example window; None takes whole series (every entity must
            then have the same length).
        input_columns: store columns of the examples (default: all columns).

    A class can appear in a task only if the sampler's pool (all usable entities, or the
    split's entities after `restrict_to`) holds at least K + Q entities of it.

    Shapes: `support.x [B, N*K, L, F]` float32, `support.y [B, N*K]` int64 in 0..N-1
    (way-major: the K shots of class 0, then of class 1, ...); `query.x [B, N*Q, L, F]`,
    `query.y [B, N*Q]`; `entity_index`/`stratum` are the anchor entity's; `split_time` is -1.

    Raises:
        ValueError: N, K, Q or lookback < 1; a bad class_by; whole series of unequal
            lengths; or fewer than N classes with K + Q entities in the pool.
    """

    needs_store = True

    def __init__(
        self,
        store: Any,
        *,
        num_ways: int = 5,
        num_shots: int = 1,
        num_query: int = 1,
        class_by: str = "label",
        lookback: int | None = 32,
        input_columns: Sequence[str] | None = None,
    ) -> None:
        _positive("nway_kshot", num_ways=num_ways, num_shots=num_shots, num_query=num_query)
        if class_by not in ("label", "stratum"):
            raise ValueError(
                f"nway_kshot sampler: class_by must be 'label' or 'stratum', got {class_by!r}"
            )
        lengths = np.asarray(store.lengths, dtype=np.int64)
        if lookback is None:
            if len(np.unique(lengths)) != 1:
                raise ValueError(
                    "nway_kshot sampler: lookback=None takes whole series, but entity lengths "
                    f"range from {int(lengths.min())} to {int(lengths.max())}; set lookback"
                )
            lookback = int(lengths[0])
        _positive("nway_kshot", lookback=lookback)
        self.store = store
        self.num_ways, self.num_shots = int(num_ways), int(num_shots)
        self.num_query, self.lookback, self.class_by = int(num_query), int(lookback), class_by
        self.input_columns = _resolve_columns(
            store,
            store.column_names if input_columns is None else input_columns,
            "input_columns",
        )
        self.unit_entity = np.flatnonzero(lengths >= self.lookback)
        if len(self.unit_entity) == 0:
            raise ValueError(
                f"nway_kshot sampler: lookback={self.lookback} is longer than every entity "
                f"(the longest has {int(lengths.max())} rows)"
            )
        self.excluded_entities = np.flatnonzero(lengths < self.lookback)
        codes = store.label_codes if class_by == "label" else store.stratum_codes
        self.class_names = np.asarray(
            store.label_names if class_by == "label" else store.stratum_names
        )
        self.unit_class = np.asarray(codes, dtype=np.int64)[self.unit_entity]
        self.unit_start = np.asarray(store.starts, dtype=np.int64)[self.unit_entity]
        self.unit_length = lengths[self.unit_entity]
        self._unit_strata = np.asarray(store.stratum_codes, dtype=np.int64)[self.unit_entity]
        self._gatherer: WindowGatherer | None = None
        self._set_pool(np.arange(len(self.unit_entity)))

    @property
    def num_units(self) -> int:
        return int(len(self.unit_entity))

    def unit_strata(self) -> np.ndarray:
        return self._unit_strata

    def restrict_to(self, units: np.ndarray) -> NWayKShotSampler:
        """A copy whose tasks draw their examples from `units` only (e.g. one split).

        Raises:
            ValueError: fewer than N classes with K + Q entities among `units`.
        """
        restricted = copy.copy(self)
        restricted._set_pool(np.asarray(units, dtype=np.int64))
        return restricted

    def _set_pool(self, units: np.ndarray) -> None:
        per_class = self.num_shots + self.num_query
        classes = self.unit_class[units]
        order = np.argsort(classes, kind="stable")
        codes, first, counts = np.unique(classes[order], return_index=True, return_counts=True)
        usable = counts >= per_class
        if usable.sum() < self.num_ways:
            raise ValueError(
                f"nway_kshot sampler: num_ways={self.num_ways} but only {int(usable.sum())} "
                f"{self.class_by} classes have num_shots + num_query = {per_class} entities "
                f"among the {len(units)} entities in use (class sizes: "
                f"{dict(zip(self.class_names[codes].tolist(), counts.tolist(), strict=True))})"
            )
        self._pool_members = units[order]
        self._class_codes = codes[usable]
        self._class_first = first[usable]
        self._class_count = counts[usable]
        self._class_slot = np.full(len(self.class_names), -1, dtype=np.int64)
        self._class_slot[self._class_codes] = np.arange(len(self._class_codes))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_gatherer"] = None
        return state

    def sample(self, units: np.ndarray, seeds: np.ndarray) -> MetaBatch:
        units = np.asarray(units, dtype=np.int64)
        num_tasks = len(units)
        n, k, q = self.num_ways, self.num_shots, self.num_query
        m = k + q
        num_classes = len(self._class_codes)
        anchor_slot = self._class_slot[self.unit_class[units]]
        if np.any(anchor_slot < 0):
            bad = units[anchor_slot < 0][:5].tolist()
            raise ValueError(
                f"nway_kshot sampler: units {bad} belong to classes with fewer than {m} "
                "entities in the sampler's pool"
            )
        rows = np.arange(num_tasks)
        class_keys = task_uniform(seeds, num_classes, stream=0)
        class_keys[rows, anchor_slot] = -1.0  # the anchor's class is always in the task
        chosen = np.argsort(class_keys, axis=1)[:, :n]
        way_order = np.argsort(task_uniform(seeds, n, stream=1), axis=1)
        ways = np.take_along_axis(chosen, way_order, axis=1)  # [B, N] class slots
        member = self._distinct_members(seeds, self._class_count[ways], m)  # [B, N, M]
        unit_pick = self._pool_members[self._class_first[ways][..., None] + member]
        span = self.unit_length[unit_pick] - self.lookback + 1
        offset = (task_uniform(seeds, n * m, stream=4).reshape(num_tasks, n, m) * span).astype(
            np.int64
        )
        start = self.unit_start[unit_pick] + np.minimum(offset, span - 1)
        if self._gatherer is None:
            self._gatherer = WindowGatherer(self.store.values, self.input_columns, self.lookback)
        gather = self._gatherer.gather
        labels = np.broadcast_to(np.arange(n)[None, :, None], (num_tasks, n, m))
        return MetaBatch(
            support=TaskSet(
                torch.from_numpy(gather(start[:, :, :k].reshape(num_tasks, n * k))),
                torch.from_numpy(labels[:, :, :k].reshape(num_tasks, n * k).copy()),
            ),
            query=TaskSet(
                torch.from_numpy(gather(start[:, :, k:].reshape(num_tasks, n * q))),
                torch.from_numpy(labels[:, :, k:].reshape(num_tasks, n * q).copy()),
            ),
            entity_index=torch.from_numpy(self.unit_entity[units]),
            stratum=torch.from_numpy(self._unit_strata[units]),
            split_time=torch.full((num_tasks,), -1, dtype=torch.int64),
        )

    @staticmethod
    def _distinct_members(seeds: np.ndarray, counts: np.ndarray, m: int) -> np.ndarray:
        """`[B, N, M]` distinct member indices in `[0, counts)`, a uniform random subset in
        random order (Floyd's algorithm, vectorised over tasks and ways; M steps)."""
        num_tasks, n = counts.shape
        u = task_uniform(seeds, n * m, stream=2).reshape(num_tasks, n, m)
        picked = np.empty((num_tasks, n, m), dtype=np.int64)
        for step in range(m):
            top = counts - m + step  # Floyd: draw from [0, top], take top on a repeat
            draw = np.minimum((u[..., step] * (top + 1)).astype(np.int64), top)
            repeat = (picked[..., :step] == draw[..., None]).any(axis=-1)
            picked[..., step] = np.where(repeat, top, draw)
        shuffle = np.argsort(task_uniform(seeds, n * m, stream=3).reshape(num_tasks, n, m), axis=2)
        return np.take_along_axis(picked, shuffle, axis=2)
