"""N-way K-shot classification episodes over the entities of a store.

The classes are entity labels (or strata). A task drawn from unit (entity) u takes u's
class and N-1 other classes, then K support and Q query examples per class, each example
a window of `lookback` rows (or the whole series) of a *different* entity of that class, so
no entity is in both the support and the query set.

Whole series (`lookback=None`) of different lengths are resampled to one length
(`resample_to` rows, default the longest series) by linear interpolation over each
series' own time axis, so every example has the same shape and no padding or mask is
needed; multivariate series keep all their columns (`[L, F]` examples). With `z_normalise`,
each case is first z-normalised per column over *all its own rows* (before it is
resampled or cut to a window), the usual preprocessing of UCR/UEA cases; linear
resampling commutes with that scaling, so it is applied to the gathered rows with the
case's statistics. Every method scored sees these same examples, and the raw-example
baselines then take them as they are (`EvaluationTasks.examples_normalised`) instead of
normalising each resampled example again over its resampled grid.

A task reads many entities, so the sampler declares `draws_across_units` and confines
itself to a split (`confined_to`): classes and examples then come from that split's
entities only — with class-disjoint splits (`data.split_by=label`), from its classes only. Class indices are remapped to 0..N-1
in a random order per task — what torchmeta's `ClassSplitter` and learn2learn's
`NWays`/`KShots` transforms did.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from metadist.batch import MetaBatch, TaskSet
from metadist.options import Configurable
from metadist.tasks.base import (
    EvaluationTasks,
    TaskSampler,
    repeated_unit_tasks,
    task_uniform,
)
from metadist.tasks.class_messages import evaluation_options, sized_classes
from metadist.tasks.options import check_positive, resolve_columns
from metadist.tasks.registry import register_task_sampler
from metadist.tasks.windows import WindowGatherer


@register_task_sampler("nway_kshot")
class NWayKShotSampler(TaskSampler, Configurable):
    """N-way K-shot classification of series windows by entity label or stratum.

    Args:
        store: an open `SeriesStore` (with a label or stratum column).
        options: the sampler's `NWayKShotSampler.Options` (below), or give its fields as
            keywords (`NWayKShotSampler(store, num_ways=5)`); kept as `self.options`.
        **keywords: the options' fields, instead of `options`.

    A class can appear in a task only if the sampler's pool (all usable entities, or the
    split's entities after `confined_to`) holds at least K + Q entities of it; a unit of a
    class with fewer anchors a task of N other classes of the pool.

    Shapes: `support.x [B, N*K, L, F]` float32, `support.y [B, N*K]` int64 in 0..N-1
    (way-major: the K shots of class 0, then of class 1, ...); `query.x [B, N*Q, L, F]`,
    `query.y [B, N*Q]`; `entity_index`/`stratum` are the anchor entity's; `split_time` is -1.

    Raises:
        ValueError: N, K, Q, lookback or resample_to < 1; a bad class_by; resample_to
            with a lookback; or fewer than N classes with K + Q entities in the pool.
    """

    @dataclass(frozen=True)
    class Options:
        """The N-way K-shot sampler's options (`sampler.options`).

        Attributes:
            num_ways: N classes per task.
            num_shots: K support examples per class.
            num_query: Q query examples per class.
            class_by: "label" or "stratum": which entity attribute is the class.
            lookback: L, rows per example window; None takes whole series.
            input_columns: store columns of the examples (default: all columns).
            resample_to: with `lookback=None`, the rows every whole series is resampled
                to (linear interpolation); default: the longest series' length when
                lengths differ, none when they are equal.
            z_normalise: z-normalise each case (entity) per column over all its rows
                before an example is resampled or cut from it (a constant column becomes
                zeros).
            fit_ways: lower N to the classes the data can give (at least 2): to the
                classes with K + Q entities in the store, then, once the run's split is
                made (`fit_ways_to`), in the split that has fewest; the N a run got is in
                its shapes and inference.json. Off: fewer classes than N is an error.
        """

        num_ways: int = 5
        num_shots: int = 1
        num_query: int = 1
        class_by: str = "label"
        lookback: int | None = 32
        input_columns: Sequence[str] | None = None
        resample_to: int | None = None
        z_normalise: bool = False
        fit_ways: bool = False

        def validate(self) -> None:
            """Checks what needs no store; `ValueError` naming the option."""
            check_positive(
                "nway_kshot",
                num_ways=self.num_ways,
                num_shots=self.num_shots,
                num_query=self.num_query,
            )
            if self.num_ways < 2:  # one class: every method scores 1.0, a task of nothing
                raise ValueError(
                    f"nway_kshot sampler: num_ways must be >= 2 (a task tells classes "
                    f"apart), got {self.num_ways}"
                )
            if self.class_by not in ("label", "stratum"):
                raise ValueError(
                    "nway_kshot sampler: class_by must be 'label' or 'stratum', got "
                    f"{self.class_by!r}"
                )
            if self.resample_to is not None:
                if self.lookback is not None:
                    raise ValueError(
                        "nway_kshot sampler: resample_to applies to whole series; set "
                        f"lookback: null to use it (got lookback={self.lookback})"
                    )
                check_positive("nway_kshot", resample_to=self.resample_to)

    needs_store = True
    draws_across_units = True

    def __init__(self, store: Any, *, options: Options | None = None, **keywords: Any) -> None:
        self.options: NWayKShotSampler.Options = self.read_options(keywords, options)
        opts = self.options
        lengths = np.asarray(store.lengths, dtype=np.int64)
        self.whole_series = opts.lookback is None
        self.z_normalise = bool(opts.z_normalise)  # the inference protocol reads it
        self.resample = False
        lookback = opts.lookback
        if lookback is None:
            if opts.resample_to is not None or len(np.unique(lengths)) != 1:
                self.resample = True
                lookback = int(opts.resample_to if opts.resample_to is not None else lengths.max())
            else:
                lookback = int(lengths[0])
        check_positive("nway_kshot", lookback=lookback)
        self.store = store
        self.num_ways, self.num_shots = int(opts.num_ways), int(opts.num_shots)
        self.num_query, self.lookback = int(opts.num_query), int(lookback)
        self.class_by = opts.class_by
        self.input_columns = resolve_columns(
            store,
            store.column_names if opts.input_columns is None else opts.input_columns,
            "input_columns",
        )
        usable = lengths >= (1 if self.resample else self.lookback)
        self.unit_entity = np.flatnonzero(usable)
        if len(self.unit_entity) == 0:
            raise ValueError(
                f"nway_kshot sampler: lookback={self.lookback} is longer than every entity "
                f"(the longest has {int(lengths.max())} rows)"
            )
        self.excluded_entities = np.flatnonzero(~usable)
        codes = store.label_codes if self.class_by == "label" else store.stratum_codes
        self.class_names = np.asarray(
            store.label_names if self.class_by == "label" else store.stratum_names
        )
        self.unit_class = np.asarray(codes, dtype=np.int64)[self.unit_entity]
        self.unit_start = np.asarray(store.starts, dtype=np.int64)[self.unit_entity]
        self.unit_length = lengths[self.unit_entity]
        self._unit_strata = np.asarray(store.stratum_codes, dtype=np.int64)[self.unit_entity]
        self._gatherer: WindowGatherer | None = None
        self._case_mean = self._case_scale = None
        if opts.z_normalise:
            self._case_mean, self._case_scale = self._case_moments()
        if opts.fit_ways:
            self._fit_ways(np.arange(len(self.unit_entity)))
        self._set_pool(np.arange(len(self.unit_entity)))

    def fit_ways_to(self, partitioner: Any) -> None:
        """With `fit_ways`, lowers N to the usable classes of the split in use that has
        fewest (meta-train, meta-val, meta-test; a split without units is not in use).

        Raises:
            ValueError: no split can give 2 ways (as `confined_to` would say).
        """
        if not self.options.fit_ways:
            return
        for split in ("train", "val", "test"):
            units = np.asarray(partitioner.units(split), dtype=np.int64)
            if len(units):
                self._fit_ways(units)

    def _fit_ways(self, units: np.ndarray) -> None:
        """N lowered to the classes with K + Q entities among `units`, if that is >= 2."""
        _, counts = np.unique(self.unit_class[units], return_counts=True)
        usable = int((counts >= self.num_shots + self.num_query).sum())
        if 2 <= usable < self.num_ways:
            self.num_ways = usable

    def _case_moments(self) -> tuple[np.ndarray, np.ndarray]:
        """`([U, F] mean, [U, F] standard deviation)` of every unit's whole case over its
        rows, per input column (a scale of 1 where a column is constant)."""
        values = np.asarray(self.store.values)
        columns = np.asarray(self.input_columns, dtype=np.int64)
        mean = np.zeros((self.num_units, len(columns)))
        scale = np.ones((self.num_units, len(columns)))
        for i, (start, length) in enumerate(zip(self.unit_start, self.unit_length, strict=True)):
            case = values[start : start + length][:, columns].astype(np.float64)
            mean[i] = case.mean(axis=0)
            std = case.std(axis=0)
            scale[i] = np.where(std > 1e-8, std, 1.0)
        return mean, scale

    @property
    def num_units(self) -> int:
        return int(len(self.unit_entity))

    def unit_strata(self) -> np.ndarray:
        return self._unit_strata

    def unit_entities(self) -> np.ndarray:
        return self.unit_entity

    def unit_classes(self) -> np.ndarray:
        """`[num_units]` int64 class code (label or stratum code) of each unit."""
        return self.unit_class

    def confined_to(self, units: np.ndarray) -> NWayKShotSampler:
        """A copy whose tasks draw classes and examples from `units` only (e.g. one split).

        Raises:
            ValueError: fewer than N classes with K + Q entities among `units`.
        """
        restricted = copy.copy(self)
        restricted._set_pool(np.asarray(units, dtype=np.int64))
        return restricted

    restrict_to = confined_to  # the name before samplers shared one protocol

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
        """N-way episodes whose every class and example comes from `units`.

        Each unit anchors `tasks_per_unit` episodes (its class and N-1 others of the
        split). `options` replace sampler options for evaluation (e.g. `num_query`);
        `train_units` give the labelled examples of the pretrained-embedding baseline.

        Raises:
            ValueError: a holdout, or a split with fewer than N classes of K + Q entities.
        """
        if holdout is not None:
            raise ValueError("eval.holdout is for forecasting; nway_kshot has no holdout protocol")
        try:
            sampler = self.with_options(**options)
        except ValueError as error:
            raise ValueError(f"eval.sampler_options: {evaluation_options(error)}") from None
        asked, ways = options.get("num_ways"), getattr(sampler, "num_ways", None)
        if asked is not None and ways != int(asked):  # fit_ways lowered it
            print(
                f"note: eval.sampler_options num_ways={asked} lowered to {ways}: "
                f"the store has that many {self.class_by} classes of num_shots + num_query "
                "examples (sampler.options.fit_ways)",
                file=sys.stderr,
            )
        units = self.units_of_entities(units, entity_mask)
        try:
            confined = sampler.confined_to(units)
        except ValueError as error:
            said = evaluation_options(error) if options else str(error)
            raise ValueError(f"the {split} split: {said}") from None
        assert isinstance(confined, NWayKShotSampler)  # confined_to keeps the class
        examples, num_classes = None, 0
        if train_units is not None and len(train_units):
            examples, num_classes = self.labelled_examples(np.asarray(train_units, np.int64))
        return repeated_unit_tasks(
            confined,
            units,
            split=split,
            tasks_per_unit=tasks_per_unit,
            max_tasks=max_tasks,
            seed=seed,
            note=(
                f" ({confined.num_ways}-way {confined.num_shots}-shot, {confined.num_query} "
                f"query per class, from {len(confined._class_codes)} {self.class_by} classes"
                f"{confined.short_classes_note()})"
            ),
            labelled_examples=examples,
            num_classes=num_classes,
            examples_normalised=bool(confined.options.z_normalise),
        )

    def labelled_examples(self, units: np.ndarray):
        """(`examples(num, seed) -> (x [num, L, F], class [num])`, number of classes) over
        `units`, classes numbered 0..C-1 in code order: an ordinary labelled data set of
        those units, for classifier pre-training (`pretrain.steps`) and the
        pretrained-embedding baseline."""
        codes = np.unique(self.unit_class[units])
        class_index = np.searchsorted(codes, self.unit_class[units])

        def examples(num: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
            seeds = np.arange(num, dtype=np.uint64) + np.uint64(seed) * np.uint64(1 << 32)
            picks = (task_uniform(seeds, 1, stream=5)[:, 0] * len(units)).astype(np.int64)
            start = self._example_starts(units[picks][:, None], seeds, 6)[:, 0]
            x = self._gather(start[:, None], units[picks][:, None])[:, 0]
            return torch.from_numpy(x), torch.from_numpy(class_index[picks].astype(np.int64))

        return examples, len(codes)

    @property
    def short_classes(self) -> dict[str, int]:
        """`{class name: entities}` of the pool's classes with fewer than K + Q entities:
        no task draws them, though the units in use hold them."""
        return dict(self._short_classes)

    def short_classes_note(self) -> str:
        """`; left out, ...` naming `short_classes` with their sizes, or "" where there
        are none."""
        if not self._short_classes:
            return ""
        return (
            f"; left out, fewer than num_shots + num_query = "
            f"{self.num_shots + self.num_query} entities: {sized_classes(self._short_classes)}"
        )

    def _fewer_classes_hint(self, usable: int, present: int) -> str:
        """What to change when units in use have `usable` classes of K + Q examples (of
        `present` classes there) and an N-way task needs `num_ways`: the lever that fits
        first (meta_batch_size never does)."""
        total = len(self.class_names)
        if present < total and present < self.num_ways:  # a split dealt only some classes
            first = (
                f"this split holds {present} of the store's {total} {self.class_by} classes: "
                f"use data.split_by=unit (every split holds every class; not class-disjoint) "
                f"or data.split_by=auto (class-disjoint only where every split gets 2 "
                f"classes), or give this split a larger share in data.fractions"
            )
        elif usable < present:  # classes there, short of examples
            first = (
                f"{present - usable} of its classes have fewer than num_shots + num_query "
                "examples: lower sampler.options.num_shots / num_query"
            )
            short = len(self.excluded_entities)
            if short:  # entities the lookback left out: a shorter window keeps them
                first += (
                    f", or sampler.options.lookback ({short} of the store's entities are "
                    f"shorter than lookback={self.lookback} and give no example)"
                )
        else:
            first = f"the store has {total} {self.class_by} classes in all"
        ways = (
            f"; or sampler.options.num_ways={usable} (sampler.options.fit_ways=true does it)"
            if 2 <= usable < self.num_ways
            else ""
        )
        return f"to fix: {first}{ways}"

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
                f"{dict(zip(self.class_names[codes].tolist(), counts.tolist(), strict=True))}); "
                f"{self._fewer_classes_hint(int(usable.sum()), len(codes))}"
            )
        self._pool_members = units[order]
        self._class_codes = codes[usable]
        self._class_first = first[usable]
        self._class_count = counts[usable]
        self._class_slot = np.full(len(self.class_names), -1, dtype=np.int64)
        self._class_slot[self._class_codes] = np.arange(len(self._class_codes))
        # {class name: cases} of the pool's classes too small to draw (never a way)
        self._short_classes = dict(
            zip(self.class_names[codes[~usable]].tolist(), counts[~usable].tolist(), strict=True)
        )

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
        rows = np.arange(num_tasks)
        class_keys = task_uniform(seeds, num_classes, stream=0)
        # The anchor's class is always in the task, unless the pool holds too few of its
        # entities (a small class in an entity split): its task then takes N classes at
        # random, so every unit still gives a task of the pool.
        anchored = anchor_slot >= 0
        class_keys[rows[anchored], anchor_slot[anchored]] = -1.0
        chosen = np.argsort(class_keys, axis=1)[:, :n]
        way_order = np.argsort(task_uniform(seeds, n, stream=1), axis=1)
        ways = np.take_along_axis(chosen, way_order, axis=1)  # [B, N] class slots
        member = self._distinct_members(seeds, self._class_count[ways], m)  # [B, N, M]
        unit_pick = self._pool_members[self._class_first[ways][..., None] + member]  # [B, N, M]
        start = self._example_starts(unit_pick.reshape(num_tasks, n * m), seeds, 4)
        start = start.reshape(num_tasks, n, m)
        labels = np.broadcast_to(np.arange(n)[None, :, None], (num_tasks, n, m))

        def examples(part: slice, count: int) -> torch.Tensor:
            rows = start[:, :, part].reshape(num_tasks, n * count)
            picked = unit_pick[:, :, part].reshape(num_tasks, n * count)
            return torch.from_numpy(self._gather(rows, picked))

        return MetaBatch(
            support=TaskSet(
                examples(slice(0, k), k),
                torch.from_numpy(labels[:, :, :k].reshape(num_tasks, n * k).copy()),
            ),
            query=TaskSet(
                examples(slice(k, None), q),
                torch.from_numpy(labels[:, :, k:].reshape(num_tasks, n * q).copy()),
            ),
            entity_index=torch.from_numpy(self.unit_entity[units]),
            stratum=torch.from_numpy(self._unit_strata[units]),
            split_time=torch.full((num_tasks,), -1, dtype=torch.int64),
        )

    def _example_starts(self, units: np.ndarray, seeds: np.ndarray, stream: int) -> np.ndarray:
        """`[B, M]` first store row of the example drawn from each of `units [B, M]`: a
        uniform window start (the series' first row for whole series)."""
        if self.whole_series:
            return self.unit_start[units]
        span = self.unit_length[units] - self.lookback + 1
        u = task_uniform(seeds, units.shape[1], stream=stream)
        return self.unit_start[units] + np.minimum((u * span).astype(np.int64), span - 1)

    def _gather(self, starts: np.ndarray, units: np.ndarray) -> np.ndarray:
        """`[*S, L, F]` float32 examples starting at store rows `starts [*S]` of `units`
        (each z-normalised with its whole case's moments under `z_normalise`)."""
        x = self._gather_rows(starts, units)
        if self._case_mean is None or self._case_scale is None:
            return x
        mean = self._case_mean[units][..., None, :]
        scale = self._case_scale[units][..., None, :]
        return np.ascontiguousarray((x - mean) / scale, dtype=np.float32)

    def _gather_rows(self, starts: np.ndarray, units: np.ndarray) -> np.ndarray:
        """`[*S, L, F]` float32 store rows (resampled whole series, or windows)."""
        if not self.resample:
            if self._gatherer is None:
                self._gatherer = WindowGatherer(
                    self.store.values, self.input_columns, self.lookback
                )
            return self._gatherer.gather(starts)
        # Whole series resampled to L rows: row j sits at position j·(n-1)/(L-1) of a
        # series of n rows, linearly interpolated between its two neighbours.
        lengths = self.unit_length[units][..., None].astype(np.float64)  # [*S, 1]
        steps = np.arange(self.lookback, dtype=np.float64) / max(self.lookback - 1, 1)
        position = steps * (lengths - 1)  # [*S, L]
        low = np.floor(position).astype(np.int64)
        high = np.minimum(low + 1, lengths.astype(np.int64) - 1)
        weight = (position - low)[..., None].astype(np.float32)
        values = np.asarray(self.store.values)
        columns = np.asarray(self.input_columns, dtype=np.int64)
        first = starts[..., None]
        below = values[(first + low)[..., None], columns]
        above = values[(first + high)[..., None], columns]
        return np.ascontiguousarray(below * (1 - weight) + above * weight, dtype=np.float32)

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
