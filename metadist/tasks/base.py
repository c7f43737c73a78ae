"""The task-sampler protocol, the sampler registry and per-task random numbers.

A task sampler turns *units* (entities of a store, or entity time chunks, or just task
numbers for synthetic families) into tasks. The partitioner decides which units each rank
gets; the sampler decides what a task drawn from a unit looks like. Every task's
randomness comes from its own 64-bit seed, so a task does not depend on which batch,
worker or rank it lands in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from metadist.batch import MetaBatch

_REGISTRY: dict[str, type[TaskSampler]] = {}


class TaskSampler(ABC):
    """Base class of every task sampler.

    Subclasses set `needs_store` and implement `num_units` and `sample`. Constructor
    options are keyword arguments validated in `__init__` (raise `ValueError` naming the
    option).
    """

    name: ClassVar[str] = ""
    needs_store: ClassVar[bool] = True

    @property
    @abstractmethod
    def num_units(self) -> int:
        """How many units the partitioner can deal."""

    def unit_strata(self) -> np.ndarray:
        """`[num_units]` int64 stratum code of each unit (all 0 by default)."""
        return np.zeros(self.num_units, dtype=np.int64)

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


def register_task_sampler(name: str):
    """Class decorator registering a `TaskSampler` under `name`.

    Registration happens when the defining module is imported; a training run selects a
    sampler of your own with `imports=[your_module] sampler.name=NAME`.

    Example:
        >>> @register_task_sampler("my_sampler")
        ... class MySampler(TaskSampler): ...
    """

    def decorator(cls: type[TaskSampler]) -> type[TaskSampler]:
        if not (isinstance(cls, type) and issubclass(cls, TaskSampler)):
            raise TypeError(f"@register_task_sampler({name!r}) needs a TaskSampler subclass")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(
                f"task sampler {name!r} is already registered by "
                f"{existing.__module__}.{existing.__qualname__}"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def registered_task_samplers() -> list[str]:
    """Names of all registered samplers, sorted."""
    return sorted(_REGISTRY)


def get_task_sampler(name: str) -> type[TaskSampler]:
    """The sampler class registered as `name`; `ValueError` listing the known names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(registered_task_samplers()) or "none"
        raise ValueError(f"unknown task sampler {name!r}; registered: {known}") from None


def build_task_sampler(name: str, store: Any = None, **options: Any) -> TaskSampler:
    """Builds the sampler registered as `name` with `options`.

    Raises:
        ValueError: unknown name, a sampler that needs a store given none, or a bad option.
    """
    cls = get_task_sampler(name)
    if cls.needs_store:
        if store is None:
            raise ValueError(f"task sampler {name!r} reads a series store: set data.store")
        return cls(store, **options)
    return cls(**options)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(z: np.ndarray) -> np.ndarray:
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
    """`[B, num]` int64 uniform in `[0, high)` (`high` scalar or `[B]`/`[B, 1]`, each ≥ 1)."""
    high = np.asarray(high, dtype=np.int64)
    if high.ndim == 1:
        high = high[:, None]
    if np.any(high < 1):
        raise ValueError("task_integers needs high >= 1")
    u = task_uniform(seeds, num, stream)
    return np.minimum((u * high).astype(np.int64), high - 1)
