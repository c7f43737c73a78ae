"""The loader's arguments, checked once and given one type each.

`BatchMetaDataLoader` accepts a sampler or a sampler's registered name, and a partitioner
or an array of units; `resolve_sampler` and `resolve_dealer` turn those into the one type
the loader works with (a `TaskSampler`, a `UnitDealer`). Every other argument is a field
of `LoaderSettings`, a frozen dataclass that checks itself when built.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadist.data.dealing import UnitDealer
from metadist.data.orders import DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW_BLOCKS, ORDERS
from metadist.data.partition import StratifiedTaskPartitioner
from metadist.tasks.base import TaskSampler, confined
from metadist.tasks.registry import build_task_sampler
from metadist.tasks.units import checked_num_units, checked_unit_strata

DEFAULT_READ_AHEAD = 4


@dataclass(frozen=True)
class LoaderSettings:
    """How a loader deals its tasks and computes its batches (see `BatchMetaDataLoader`).

    The counts the loader computes with are stored as `int` (a numpy integer becomes an
    `int`). `read_ahead=None` asks the loader to choose (see `BatchMetaDataLoader`).
    `num_workers`, `pin_memory`, `persistent_workers`, `prefetch_factor` (`None`: torch's
    default) and `multiprocessing_context` (a start-method name or a context) are passed
    to `torch.utils.data.DataLoader`; `block_bytes` and `window_blocks` are checked by the
    blocked order's `UnitDealer`.

    Raises:
        ValueError: a count that is not an integer, batch_size < 1, world_size < 1, rank
            outside 0..world_size-1, a negative seed or num_workers, an unknown order, or
            a negative read_ahead.
    """

    batch_size: int
    split: str = "train"
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    multiprocessing_context: Any = None
    order: str = "random"
    block_bytes: int = DEFAULT_BLOCK_BYTES
    window_blocks: int = DEFAULT_WINDOW_BLOCKS
    read_ahead: int | None = None
    release: bool = False

    def __post_init__(self) -> None:
        for name in ("batch_size", "seed", "rank", "world_size", "num_workers"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if int(self.num_workers) < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if isinstance(self.batch_size, bool) or int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if isinstance(self.world_size, bool) or int(self.world_size) < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= int(self.rank) < int(self.world_size):
            raise ValueError(f"rank must be in 0..{int(self.world_size) - 1}, got {self.rank}")
        if isinstance(self.seed, bool) or int(self.seed) < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        read_ahead = self.read_ahead
        if read_ahead is not None and (isinstance(read_ahead, bool) or int(read_ahead) < 0):
            raise ValueError(f"read_ahead must be an integer >= 0, got {read_ahead!r}")
        # Stored as the loader uses them; the others go to torch or the dealer as given.
        for name in ("batch_size", "seed", "rank", "world_size", "num_workers"):
            object.__setattr__(self, name, int(getattr(self, name)))
        if read_ahead is not None:
            object.__setattr__(self, "read_ahead", int(read_ahead))


def resolve_sampler(
    sampler: TaskSampler | str, store: Any, sampler_options: dict[str, Any] | None
) -> TaskSampler:
    """`sampler`, or the sampler registered under that name built on `store` with
    `sampler_options`.

    Raises:
        ValueError: an unknown name (listing the registered ones), a bad option, or
            something that is neither a `TaskSampler` nor a name.
    """
    if isinstance(sampler, str):
        return build_task_sampler(sampler, store, **(sampler_options or {}))
    if not isinstance(sampler, TaskSampler):
        raise ValueError(
            f"sampler must be a TaskSampler or a registered sampler name, got "
            f"{type(sampler).__name__}"
        )
    return sampler


def resolve_dealer(
    partitioner_or_units: StratifiedTaskPartitioner | np.ndarray,
    sampler: TaskSampler,
    split: str,
    seed: int,
) -> UnitDealer:
    """The dealer of the loader's units: the partitioner's dealer of `split`, or a dealer
    of the given unit array (stratified by `sampler.unit_strata()`, ordered by `seed`).

    Raises:
        ValueError: a partitioner built for another number of units, an unknown split,
            or units outside the sampler's.
    """
    num_units = checked_num_units(sampler)
    if isinstance(partitioner_or_units, StratifiedTaskPartitioner):
        if partitioner_or_units.num_units != num_units:
            raise ValueError(
                f"the partitioner deals {partitioner_or_units.num_units} units but the "
                f"sampler has {num_units}; build it from sampler.unit_strata()"
            )
        return partitioner_or_units.dealer(split)
    given = np.asarray(partitioner_or_units)
    if given.size and not np.issubdtype(given.dtype, np.integer):
        raise ValueError(
            f"units must be integer unit indices (or a StratifiedTaskPartitioner), got "
            f"dtype {given.dtype}"
        )
    units = given.astype(np.int64).reshape(-1)
    bad = units[(units < 0) | (units >= num_units)]
    if len(bad):
        raise ValueError(f"units {bad[:5].tolist()} are outside the sampler's 0..{num_units - 1}")
    return UnitDealer(units, checked_unit_strata(sampler)[units], seed=seed)


def check_batch_fits(num_units: int, settings: LoaderSettings) -> None:
    """Every rank must get at least one whole batch of the split's `num_units` tasks.

    Raises:
        ValueError: world_size larger than the tasks, or batch_size larger than the tasks
            a rank gets per epoch.
    """
    world_size, batch_size, split = settings.world_size, settings.batch_size, settings.split
    if num_units == 0:
        raise ValueError(
            f"split {split!r} has no units to deal tasks from: the partitioner's fractions "
            "give it no share, or the unit array is empty"
        )
    if world_size > num_units:
        raise ValueError(
            f"world_size={world_size} is larger than the {num_units} tasks of split {split!r}"
        )
    per_rank = num_units // world_size
    if batch_size > per_rank:
        raise ValueError(
            f"batch_size={batch_size} is larger than the {per_rank} tasks each rank "
            f"gets per epoch of split {split!r} ({num_units} tasks / world_size "
            f"{world_size})"
        )


def confined_sampler(sampler: TaskSampler, units: np.ndarray, split: str) -> TaskSampler:
    """`sampler` confined to the split's `units`.

    A sampler whose tasks read several units (N-way classification) sees only this split's
    units; one whose tasks read their own unit is returned as it is.
    """
    try:
        return confined(sampler, units)
    except ValueError as error:
        raise ValueError(f"split {split!r}: {error}") from None


def resolve_read_ahead(
    settings: LoaderSettings,
    sampler: TaskSampler,
    unit_rows: tuple[np.ndarray, np.ndarray] | None,
) -> int:
    """The batches read ahead: `settings.read_ahead`, or where it is None, the default
    (see `BatchMetaDataLoader`).

    Raises:
        ValueError: a blocked order or read-ahead with a sampler whose `unit_rows()` is None.
    """
    read_ahead = settings.read_ahead
    if read_ahead is None:
        larger = unit_rows is not None and larger_than_page_cache(sampler.store)
        read_ahead = DEFAULT_READ_AHEAD if settings.order == "blocked" or larger else 0
    if unit_rows is None and (settings.order == "blocked" or read_ahead > 0):
        raise ValueError(
            f"order={settings.order!r} with read_ahead={read_ahead} needs a sampler that says "
            f"where its units lie in the store (unit_rows()); sampler "
            f"{sampler.name or sampler!r} does not: use order='random' and read_ahead=0"
        )
    return read_ahead


def ordered_dealer(
    dealer: UnitDealer,
    settings: LoaderSettings,
    sampler: TaskSampler,
    unit_rows: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[UnitDealer, np.ndarray | None]:
    """`dealer` in the settings' order, and with `release`, `[num_blocks, 2]` the store
    rows of every block of the blocked order (None otherwise).

    Raises:
        ValueError: `release` without the blocked order, or bad blocked-order settings.
    """
    if settings.order != "blocked":
        if settings.release:
            raise ValueError("release=True needs order='blocked' (blocks are what it drops)")
        return dealer, None
    assert unit_rows is not None
    row_bytes = sampler.store.num_columns * 4 + 8  # float32 values + int64 time
    blocked = dealer.reordered(
        "blocked",
        unit_bytes=np.asarray(unit_rows[1], dtype=np.int64)[dealer.units] * row_bytes,
        block_bytes=settings.block_bytes,
        window_blocks=settings.window_blocks,
    )
    return blocked, blocked.block_rows(*unit_rows) if settings.release else None


def larger_than_page_cache(store: Any) -> bool:
    """Whether the store's files exceed the memory available now (Linux `MemAvailable`);
    False where that is unknown."""
    try:
        with open("/proc/meminfo") as info:
            fields = dict(line.split(":", 1) for line in info)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return False
    return int(store.values.nbytes) + int(store.times.nbytes) > available
