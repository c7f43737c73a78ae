"""The task-sampler protocol and per-task random numbers (the registry: `.registry`).

A task sampler turns *units* (entities of a store, or entity time chunks, or just task
numbers for synthetic families) into tasks. The partitioner decides which units each rank
gets; the sampler decides what a task drawn from a unit looks like. Every task's
randomness comes from its own 64-bit seed, so a task does not depend on which batch,
worker or rank it lands in.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from metadist.batch import MetaBatch
from metadist.options import Configurable, from_mapping
from metadist.tasks.naming import sampler_label


@dataclass
class EvaluationTasks:
    """The episodes a sampler is scored on: what `TaskSampler.for_evaluation` returns.

    Attributes:
        num_tasks: how many tasks `batches` yields in all.
        description: one line for the report, e.g. "120 test units, sampler forecast".
        batches: `batches(batch_size, seed)` yields the tasks as `MetaBatch`es of at most
            `batch_size` tasks; the same arguments give the same tasks.
        target_columns: store column of each forecast target, when the tasks forecast
            store columns (they are then scored in the store's original units); `None`
            scores them as sampled.
        labelled_examples: for classification samplers, `labelled_examples(num, seed)`
            returns `(x [num, *input_shape], class [num])` examples of the sampler's
            *training* units with their global class index, for baselines that pretrain
            an ordinary classifier; `None` where that does not apply.
        num_classes: number of global classes `labelled_examples` uses.
        examples_normalised: classification: the sampler already z-normalised each case
            as a whole (before resampling it), so the raw-example baselines take the
            examples as they are rather than normalising each one again.
        settings: entries for the report's settings (`metrics.json` and the header), e.g.
            the split protocol and the classes of each split (`describe_split`).
    """

    num_tasks: int
    description: str
    batches: Callable[[int, int], Iterator[MetaBatch]]
    target_columns: list[int] | None = None
    labelled_examples: Callable[[int, int], tuple[Any, Any]] | None = None
    num_classes: int = 0
    examples_normalised: bool = False
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)


class TaskSampler(ABC):
    """Base class of every task sampler.

    Subclasses set `needs_store` and implement `num_units` and `sample`. Their options are
    either a nested `Options` dataclass, kept typed as `self.options` (subclass
    `metadist.options.Configurable` too, as the built-in samplers do), or plain keyword
    arguments of the constructor; either way they are checked when the sampler is built
    (raise `ValueError` naming the option).

    Splits and evaluation. A task drawn from unit u must only read data of u, or of the
    units of u's split: meta-train, meta-val and meta-test never share an example. A
    sampler whose tasks read only their own unit keeps `draws_across_units = False` and
    needs nothing more. A sampler whose tasks read *several* units (an N-way task takes
    examples of N classes from many entities) sets `draws_across_units = True` and
    implements `confined_to(units)`, a copy that draws only from `units`; the loader and
    the evaluator confine it to the split they use, and refuse a sampler that declares
    `draws_across_units` without `confined_to`. `for_evaluation` is the evaluation
    protocol: which episodes of a split are scored (override it to score differently
    than training draws, as the forecast sampler does).
    """

    name: ClassVar[str] = ""
    needs_store: ClassVar[bool] = True
    draws_across_units: ClassVar[bool] = False
    # Options that shape training tasks only (the evaluation protocol fixes them), so the
    # members of an evaluation ensemble may differ in them.
    training_only_options: ClassVar[tuple[str, ...]] = ()
    # Whether an ensemble member may look back over fewer rows than the evaluated run
    # (it then reads the most recent `lookback` rows of each input window).
    ensemble_may_shorten_lookback: ClassVar[bool] = False
    # The sampler's options, where it records them: its typed `Options` (a `Configurable`
    # sampler, as the built-in ones are) or a dict of its constructor's keywords.
    # `with_options` then rebuilds it with some replaced (`eval.sampler_options`).
    options: Any = None
    # Where a sampler's options sit in a config, and what it is called, in messages.
    options_path: ClassVar[str] = "sampler.options"
    options_label: ClassVar[str] = "task sampler"
    # The series store the sampler reads (`needs_store`), which the loader asks to drop
    # pages it has used; None for samplers without one.
    store: Any = None

    @property
    @abstractmethod
    def num_units(self) -> int:
        """How many units the partitioner can deal."""

    def unit_strata(self) -> np.ndarray:
        """`[num_units]` int64 stratum code of each unit (all 0 by default)."""
        return np.zeros(self.num_units, dtype=np.int64)

    def unit_entities(self) -> np.ndarray | None:
        """`[num_units]` int64 store entity of each unit, or `None` for samplers whose
        units are not store entities (e.g. sinusoid task numbers)."""
        return None

    def unit_rows(self) -> tuple[np.ndarray, np.ndarray] | None:
        """`(first_row, num_rows)`, each `[num_units]` int64: the store rows every task of
        a unit reads lie in `[first_row, first_row + num_rows)`.

        None (the default) when tasks are not confined to one store region per unit; the
        loader's blocked order and read-ahead need it.
        """
        return None

    def task_rows(self, units: np.ndarray, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(first_row [B], end_row [B])`: the store rows task i reads, for read-ahead.

        The default is the task's whole unit; samplers that read a small part of a unit
        narrow it. Only called when `unit_rows()` is not None.
        """
        rows = self.unit_rows()
        assert rows is not None
        first = rows[0][units]
        return first, first + rows[1][units]

    @abstractmethod
    def sample(self, units: np.ndarray, seeds: np.ndarray) -> MetaBatch:
        """Draws one task per unit.

        Args:
            units: `[B]` int64 unit indices in `[0, num_units)`.
            seeds: `[B]` uint64 task seeds; task i depends on `units[i]` and `seeds[i]` only.

        Returns:
            A `MetaBatch` of B tasks, float32 contiguous inputs and targets.
        """

    def confined_to(self, units: np.ndarray) -> TaskSampler:
        """A sampler whose tasks, drawn from any of `units`, read data of `units` only.

        The default serves samplers whose tasks read their own unit only (it returns
        `self`). Samplers with `draws_across_units = True` must override it.

        Raises:
            ValueError: the sampler draws across units and cannot be confined, or `units`
                cannot fill its tasks (e.g. fewer classes than N ways).
        """
        if self.draws_across_units:
            raise ValueError(
                f"task sampler {self.name!r} draws each task from several units "
                "(draws_across_units = True) but does not implement confined_to(units), so "
                "its tasks cannot be kept inside one split; it cannot be trained or evaluated "
                "on a split"
            )
        return self

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
        """The evaluation protocol: the episodes scored on the split holding `units`.

        The default draws `tasks_per_unit` tasks from each of `units` (task seeds from
        the evaluation seed and the task's position) with this sampler confined to
        `units`, so every example of every episode comes from the evaluated split.

        Args:
            units: `[n]` unit indices of the evaluated split.
            split: its name, for messages and the description.
            tasks_per_unit: tasks drawn from each unit (> 1 only where tasks are random).
            max_tasks: score a random subset of this many tasks (seeded by `seed`);
                `None` scores them all.
            seed: the evaluation seed (task draws and the `max_tasks` subset).
            entity_mask: `[num_entities]` bool; only units of these store entities are
                scored (`eval.labels`). Needs `unit_entities()`.
            train_units: the meta-train units (for `labelled_examples`), if any.
            holdout: a separate holdout (`{entity: (times, values)}`), for samplers that
                support one; others refuse it.
            **options: evaluation-only sampler options (`eval.sampler_options`); the
                default takes none.

        Raises:
            ValueError: options or a holdout this sampler does not take, or a split its
                tasks cannot be drawn from.
        """
        if holdout is not None:
            raise ValueError(
                f"eval.holdout needs a forecasting sampler on a series store; {self.name!r} "
                "has no holdout protocol"
            )
        units = self.units_of_entities(units, entity_mask)
        sampler = confined(self.with_options(**options), units)
        return repeated_unit_tasks(
            sampler,
            units,
            split=split,
            tasks_per_unit=tasks_per_unit,
            max_tasks=max_tasks,
            seed=seed,
        )

    def with_options(self, **options: Any) -> TaskSampler:
        """This sampler rebuilt with `options` replaced (itself when there are none).

        Raises:
            ValueError: options for a sampler that does not record its own (`options`),
                or options its constructor rejects.
        """
        if not options:
            return self
        if self.options is None:
            raise ValueError(
                f"eval.sampler_options: task sampler {self.name!r} does not record its options "
                f"(self.options), so it cannot be rebuilt with {sorted(options)}"
            )
        typed = dataclasses.is_dataclass(self.options)
        current = (
            {f.name: getattr(self.options, f.name) for f in dataclasses.fields(self.options)}
            if typed
            else dict(self.options)
        )
        unknown = sorted(set(options) - set(current))
        if unknown:
            raise ValueError(
                f"eval.sampler_options: task sampler {self.name!r} has no option {unknown[0]!r}; "
                f"its options: {', '.join(sorted(current))}"
            )
        merged = {**current, **options}
        rebuild: Any = type(self)  # a concrete sampler, whose constructor takes the options
        args = (self.store,) if self.needs_store else ()
        if typed and isinstance(self, Configurable):
            what = f"option of task sampler {self.name!r}"
            checked = from_mapping(self.Options, merged, "eval.sampler_options", what=what)
            return rebuild(*args, options=checked)
        return rebuild(*args, **merged)

    def units_of_entities(self, units: np.ndarray, entity_mask: np.ndarray | None) -> np.ndarray:
        """The `units` whose store entity is in `entity_mask` (all of them without one).

        Raises:
            ValueError: a mask for a sampler whose units are not store entities.
        """
        units = np.asarray(units, dtype=np.int64)
        if entity_mask is None:
            return units
        entities = self.unit_entities()
        if entities is None:
            raise ValueError(
                f"eval.labels needs a sampler whose tasks come from store entities; "
                f"{self.name!r} has none"
            )
        return units[np.asarray(entity_mask, dtype=bool)[entities[units]]]


def confined(sampler: TaskSampler, units: np.ndarray) -> TaskSampler:
    """`sampler.confined_to(units)`, checked to be a sampler.

    Raises:
        ValueError: what `confined_to` raises, or it returned something else than a
            `TaskSampler` (a `confined_to` of one's own that forgot its `return`).
    """
    result = sampler.confined_to(units)
    if not isinstance(result, TaskSampler):
        raise ValueError(
            f"{sampler_label(sampler)}: confined_to(units) returned "
            f"{type(result).__name__}, not a TaskSampler; to fix: return the sampler "
            "confined to the units (a copy, or self)"
        )
    return result


def repeated_unit_tasks(
    sampler: TaskSampler,
    units: np.ndarray,
    *,
    split: str,
    tasks_per_unit: int = 1,
    target_columns: list[int] | None = None,
    note: str = "",
    labelled_examples: Callable[[int, int], tuple[Any, Any]] | None = None,
    num_classes: int = 0,
    max_tasks: int | None = None,
    seed: int = 0,
    examples_normalised: bool = False,
) -> EvaluationTasks:
    """`EvaluationTasks` drawing `tasks_per_unit` tasks from each of `units` with `sampler`.

    Task j of the plan is unit `units[j // tasks_per_unit]` with seed
    `derive_task_seeds(seed, 0, j)`: a function of the seed and its position only. With
    `max_tasks`, a seeded random subset of the plan's positions is scored.
    """
    if isinstance(tasks_per_unit, bool) or int(tasks_per_unit) < 1:
        raise ValueError(f"eval.tasks_per_unit must be an integer >= 1, got {tasks_per_unit!r}")
    tasks_per_unit = int(tasks_per_unit)
    plan = np.repeat(np.asarray(units, dtype=np.int64), tasks_per_unit)
    positions = random_subset(np.arange(len(plan), dtype=np.int64), max_tasks, seed)

    def batches(batch_size: int, seed: int = seed) -> Iterator[MetaBatch]:
        for first in range(0, len(positions), batch_size):
            chosen = positions[first : first + batch_size]
            yield sampler.sample(plan[chosen], derive_task_seeds(seed, 0, chosen))

    per_unit = f", {tasks_per_unit} tasks each" if tasks_per_unit > 1 else ""
    subset = (
        f", a random {len(positions)} of its {len(plan)} tasks"
        if len(positions) < len(plan)
        else ""
    )
    return EvaluationTasks(
        num_tasks=len(positions),
        description=(f"{len(units)} {split} units{per_unit}{subset}, sampler {sampler.name}{note}"),
        batches=batches,
        target_columns=target_columns,
        labelled_examples=labelled_examples,
        num_classes=num_classes,
        examples_normalised=examples_normalised,
    )


_TAG_SUBSET = 0x535542534554


def random_subset(items: np.ndarray, max_items: int | None, seed: int) -> np.ndarray:
    """A seeded random subset of `max_items` of `items`, in their original order (all of
    them when `max_items` is `None` or not smaller)."""
    if max_items is None or max_items >= len(items):
        return items
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), _TAG_SUBSET])))
    return items[np.sort(rng.choice(len(items), size=int(max_items), replace=False))]


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(z: Any) -> Any:
    """SplitMix64 of `z` (a uint64 scalar or array), elementwise."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def derive_task_seeds(seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
    """`[B]` uint64 seeds for the tasks at global `positions` of epoch `epoch`.

    Depends on (seed, epoch, position) only: not on rank, world size, batch or worker.
    """
    positions = np.asarray(positions, dtype=np.uint64)
    with np.errstate(over="ignore"):
        base = _splitmix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) ^ _splitmix64(np.uint64(epoch)))
        return _splitmix64(base ^ _splitmix64(positions))


def task_uniform(seeds: np.ndarray, num: int, stream: int = 0) -> np.ndarray:
    """`[B, num]` float64 uniform numbers in [0, 1), row i a function of `seeds[i]` only.

    Different `stream` values give independent numbers from the same seeds, so a sampler
    can draw e.g. split times and window offsets without one shifting the other.
    """
    seeds = np.asarray(seeds, dtype=np.uint64)[:, None]
    counters = np.arange(num, dtype=np.uint64)[None, :] + np.uint64(stream) * np.uint64(1 << 32)
    with np.errstate(over="ignore"):
        bits = _splitmix64(seeds ^ _splitmix64(counters))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def task_integers(
    seeds: np.ndarray, high: np.ndarray | int, num: int, stream: int = 0
) -> np.ndarray:
    """`[B, num]` int64 uniform in `[0, high)` (`high` scalar or `[B]`/`[B, 1]`, each ≥ 1).

    Raises:
        ValueError: a `high` below 1, naming it (and its row, for an array).
    """
    given = np.asarray(high)
    high = given.astype(np.int64, copy=False)
    if high.ndim == 1:
        high = high[:, None]
    if np.any(high < 1):
        if given.ndim == 0:
            raise ValueError(f"task_integers needs high >= 1, got high={given.item()!r}")
        rows = np.flatnonzero(high.ravel() < 1)
        more = f", and {len(rows) - 1} more below 1" if len(rows) > 1 else ""
        raise ValueError(
            f"task_integers needs high >= 1, got high[{rows[0]}]="
            f"{given.ravel()[rows[0]].item()!r} (of {given.size} rows){more}"
        )
    u = task_uniform(seeds, num, stream)
    return np.minimum((u * high).astype(np.int64), high - 1)
