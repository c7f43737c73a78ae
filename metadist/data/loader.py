"""`BatchMetaDataLoader`: batches of tasks for one rank, epoch after epoch, resumable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from metadist.batch import MetaBatch
from metadist.data.loader_settings import (
    LoaderSettings,
    check_batch_fits,
    confined_sampler,
    ordered_dealer,
    resolve_dealer,
    resolve_read_ahead,
    resolve_sampler,
)
from metadist.data.orders import DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW_BLOCKS
from metadist.data.partition import StratifiedTaskPartitioner
from metadist.data.position import position_state, read_position_state
from metadist.data.worker_start import check_sampler_reaches_workers
from metadist.tasks.base import TaskSampler, derive_task_seeds
from metadist.tasks.units import checked_unit_rows
from metadist.user_code import user_code_location

_NO_RELEASE = np.empty((0, 2), dtype=np.int64)


class _TaskBatches(Dataset):
    """Map-style dataset whose keys are whole task batches: `(units [B], seeds [B],
    release [R, 2])`.

    The key carries everything a batch depends on, so a worker process (forked, spawned
    or persistent across epochs) computes exactly what the main process would. `release`
    lists store row ranges that no task needs any more, dropped from the page cache by
    the process that computes the batch (each process maps the store itself); it changes
    nothing in the batch.
    """

    def __init__(self, sampler: TaskSampler) -> None:
        self.sampler = sampler

    def __getitem__(self, key: tuple[np.ndarray, np.ndarray, np.ndarray]) -> MetaBatch:
        units, seeds, release = key
        try:
            batch = self.sampler.sample(units, seeds)
        except Exception as error:
            if get_worker_info() is None:
                raise  # in this process: the error as raised, with its traceback
            # a worker's error reaches the main process as text (torch's "Caught ... in
            # DataLoader worker process 0" and the worker's traceback): one line made
            # here, where the user's frames are, for `_batches` to take out
            name = getattr(self.sampler, "name", type(self.sampler).__name__)
            where = user_code_location(error, installed=False)
            said = " ".join(str(error).split())  # one line, whatever the error's
            raise ValueError(
                f"{_WORKER_FAILED}sampler {name!r}: {type(error).__name__}: {said}{where}"
            ) from None
        for first_row, end_row in release.tolist():
            self.sampler.store.release(first_row, end_row)
        return batch


class _PlanSampler(Sampler):
    """Yields the task-batch keys of the loader's current epoch from its position."""

    def __init__(self, loader: BatchMetaDataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return self.loader._advised(self.loader._plan())

    def __len__(self) -> int:
        return self.loader._num_batches_left()


_WORKER_FAILED = "in a loader worker, "


def _worker_line(message: str) -> str | None:
    """The one line a worker made of its sampler's error (`_TaskBatches`), out of the
    text torch brings back from the worker; `None` where there is none."""
    for line in reversed(message.splitlines()):
        _, found, rest = line.partition(_WORKER_FAILED)
        if found:
            return f"{_WORKER_FAILED}{rest}"
    return None


def _identity(batch: Any) -> Any:
    """The loader's collate: each item is already a whole `MetaBatch`."""
    return batch


class BatchMetaDataLoader:
    """Yields `MetaBatch`es of `batch_size` tasks for one rank, one epoch per `iter()`.

    Each step, the `world_size` ranks together consume the next `world_size * batch_size`
    tasks of the split's global order (see `metadist.data.dealing`), so the whole run's
    position is one integer (`metadist.data.position`). Task i of the order is drawn from unit `order[i]` with seed
    `derive_task_seeds(seed, epoch, i)`, so the stream does not depend on the number of
    workers, the multiprocessing context, the rank count or the batch size.

    The two arguments that come in two forms are resolved once into one type each (a
    `TaskSampler`, a `UnitDealer`: `metadist.data.loader_settings`); every other argument
    is a field of the frozen `LoaderSettings` (`loader.settings`), checked when built.

    Args:
        sampler: a `TaskSampler`, or the registered name of one (built with `store` and
            `sampler_options`).
        partitioner_or_units: a `StratifiedTaskPartitioner` (its `split` is dealt), or a
            `[n]` array of unit indices to deal (stratified by `sampler.unit_strata()`).
        batch_size: tasks per batch on this rank (B).
        split: "train", "val" or "test" when given a partitioner.
        seed: seeds the task draws (and the epoch order when given a unit array).
        rank: this process's rank in 0..world_size-1.
        world_size: number of ranks.
        num_workers, pin_memory, persistent_workers, prefetch_factor, multiprocessing_context:
            passed to `torch.utils.data.DataLoader` (one item per task batch). With
            `num_workers=0` the same items are computed in this process without
            DataLoader's per-item bookkeeping; `pin_memory` then pins each batch when CUDA
            is available.
        store: the store a sampler given by name reads.
        sampler_options: options of a sampler given by name.
        order: "random" (default: the split's units shuffled, strata interleaved) or
            "blocked" (for stores larger than the memory free for the page cache: blocks
            of about `block_bytes` of the store, in file order, shuffled; the tasks of
            `window_blocks` blocks at a time interleaved at random, each block read front
            to back; see `metadist.data.orders`). Needs a sampler whose
            `unit_rows()` says where its units lie in the store.
        block_bytes, window_blocks: the blocked order's block size and window.
        read_ahead: with a sampler that has `unit_rows()`, how many batches ahead of the
            one being computed the loader asks the kernel to read the store rows their
            tasks need (`posix_fadvise` WILLNEED), so disk reads overlap the work; 0 turns
            it off. Default (None): 4 with the blocked order; with the random order, 4
            when the store's files are larger than the memory the page cache can use
            now (`MemAvailable`), else 0 (advice on cached pages only costs time). It
            changes no batch, so this machine-dependent choice keeps the stream
            machine-independent.
        release: with the blocked order, drop a block's rows from the page cache
            (`madvise` + `posix_fadvise` DONTNEED) once every rank is past it, so the
            cache keeps only what is about to be read. Off by default: measured on a store
            1.5x the page cache, keeping used blocks (pages a later epoch reads again stay
            cached; the kernel evicts the oldest) was faster (BENCHMARKS.md). For a store
            many times the cache shared with other work.

    Yields:
        `MetaBatch` with B tasks (`batch["train"]` / `batch["test"]` give the support
        and query `(inputs, targets)`).

    Raises:
        ValueError: an unknown sampler name (listing the registered ones), batch_size < 1,
            rank outside the world, world_size larger than the tasks, batch_size larger
            than the tasks a rank gets per epoch, an unknown order, or a blocked order or
            read-ahead with a sampler that does not say where its units lie.

    Example:
        >>> loader = BatchMetaDataLoader(sampler, partitioner, batch_size=16,
        ...                              rank=rank, world_size=world_size, num_workers=2)
        >>> for epoch in range(3):
        ...     for batch in loader:          # len(loader) batches, equal on every rank
        ...         loss = learner(batch)
        >>> state = loader.state_dict()       # {"epoch": ..., "tasks_consumed": ...}
    """

    def __init__(
        self,
        sampler: TaskSampler | str,
        partitioner_or_units: StratifiedTaskPartitioner | np.ndarray,
        *,
        batch_size: int,
        split: str = "train",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: Any = None,
        store: Any = None,
        sampler_options: dict[str, Any] | None = None,
        order: str = "random",
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        window_blocks: int = DEFAULT_WINDOW_BLOCKS,
        read_ahead: int | None = None,
        release: bool = False,
    ) -> None:
        sampler = resolve_sampler(sampler, store, sampler_options)
        settings = LoaderSettings(
            batch_size=batch_size,
            split=split,
            seed=seed,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            multiprocessing_context=multiprocessing_context,
            order=order,
            block_bytes=block_bytes,
            window_blocks=window_blocks,
            read_ahead=read_ahead,
            release=release,
        )
        self.settings = settings
        self.batch_size = settings.batch_size
        self.world_size = settings.world_size
        self.rank = settings.rank
        self.seed = settings.seed
        self.split = split
        dealer = resolve_dealer(partitioner_or_units, sampler, split, self.seed)
        unit_rows = sampler.unit_rows()
        self.read_ahead = resolve_read_ahead(settings, sampler, unit_rows)
        if unit_rows is not None and (self.read_ahead or settings.order == "blocked"):
            unit_rows = checked_unit_rows(sampler, unit_rows)  # read only where used
        self.dealer, self._block_rows = ordered_dealer(dealer, settings, sampler, unit_rows)
        check_batch_fits(self.dealer.num_units, settings)
        self.sampler = confined_sampler(sampler, self.dealer.units, split)
        check_sampler_reaches_workers(
            self.sampler, settings.num_workers, settings.multiprocessing_context
        )
        self.epoch = 0
        self.tasks_consumed = 0
        self._deal_cache: tuple[tuple[int, int, int], np.ndarray, np.ndarray] | None = None
        self._num_workers = settings.num_workers
        self._pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self._loader = _data_loader(self, settings)

    @property
    def tasks_per_step(self) -> int:
        """Tasks all ranks consume together per step: world_size * batch_size."""
        return self.world_size * self.batch_size

    def __len__(self) -> int:
        """Batches per full epoch on this rank (the same on every rank)."""
        return self.dealer.num_units // self.tasks_per_step

    def _num_batches_left(self) -> int:
        return (self.dealer.num_units - self.tasks_consumed) // self.tasks_per_step

    def _rank_deal(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's `(units [M], seeds [M])` from the current position to epoch end.

        The epoch is dealt from its first whole step (position `tasks_consumed %
        tasks_per_step`, 0 unless the run was resumed under another world or batch size)
        and the steps already consumed are cut off. Which rank gets which task of a round
        depends on where the deal starts (the colouring balances strata over the dealt
        stretch), so a deal from the resumed position would give the ranks the same tasks
        of a step in another arrangement: the DDP-averaged meta-gradient, a sum of per-rank
        means, would then differ in its last bits from the uninterrupted run's.
        """
        tps = self.tasks_per_step
        anchor = self.tasks_consumed % tps
        key = (self.epoch, anchor, (self.dealer.num_units - anchor) // tps)
        if self._deal_cache is None or self._deal_cache[0] != key:
            deal = self.dealer.deal(
                self.epoch, self.world_size, start=anchor, num_rounds=key[2] * self.batch_size
            )
            positions = deal.positions[self.rank]
            seeds = derive_task_seeds(self.seed, self.epoch, positions)
            self._deal_cache = (key, deal.units[self.rank], seeds)
        skip = (self.tasks_consumed - anchor) // self.world_size  # rounds consumed
        return self._deal_cache[1][skip:], self._deal_cache[2][skip:]

    def _plan(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        units, seeds = self._rank_deal()
        b = self.batch_size
        num_batches = len(units) // b
        releases = self._release_plan(num_batches)
        return [
            (units[j * b : (j + 1) * b], seeds[j * b : (j + 1) * b], releases[j])
            for j in range(num_batches)
        ]

    def _release_plan(self, num_batches: int) -> list[np.ndarray]:
        """`[R, 2]` store row ranges of the blocks to drop when computing each batch.

        A block is dropped at the first batch that starts a whole step after every rank
        took its last task (ranks may be a step apart), and again at the next batches
        until every worker process has dropped it from its own mapping.
        """
        if self._block_rows is None or num_batches == 0:
            return [_NO_RELEASE] * num_batches
        order = self.dealer.epoch_order(self.epoch)
        assert self.dealer.block_of is not None
        block = self.dealer.block_of[np.searchsorted(self.dealer.units, order)]
        last_position = np.zeros(self.dealer.num_blocks, dtype=np.int64)
        np.maximum.at(last_position, block, np.arange(len(order)))
        # batch j covers positions start + j*tps ...; drop at the first j with
        # start + (j - 1) * tps > last_position
        tps = self.tasks_per_step
        at_batch = np.maximum((last_position - self.tasks_consumed) // tps + 2, 0)
        releases = [_NO_RELEASE] * num_batches
        copies = max(self._num_workers, 1)
        for j in range(num_batches):
            due = (at_batch <= j) & (at_batch > j - copies)
            if due.any():
                releases[j] = self._block_rows[due]
        return releases

    def _advised(
        self, plan: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Yields the plan's keys, telling the kernel `read_ahead` batches in advance
        which store rows their tasks read."""
        ahead = self.read_ahead
        for j, key in enumerate(plan):
            if ahead:
                for units, seeds, _ in plan[j + ahead if j else 0 : j + ahead + 1]:
                    self.sampler.store.will_need(*self.sampler.task_rows(units, seeds))
            yield key

    def _batches(self) -> Iterator[MetaBatch]:
        if self._num_workers > 0:
            try:
                yield from self._loader
            except ValueError as error:
                line = _worker_line(str(error))
                if line is None:
                    raise
                raise ValueError(line) from None
            return
        # In-process: the same items DataLoader would fetch, without its per-batch
        # bookkeeping (tens of microseconds, a noticeable share of a fast batch).
        dataset = self._loader.dataset
        for key in self._advised(self._plan()):
            batch = dataset[key]
            yield batch.pin_memory() if self._pin_memory else batch

    def __iter__(self) -> Iterator[MetaBatch]:
        if self._num_batches_left() == 0:
            self.epoch += 1
            self.tasks_consumed = 0
        for batch in self._batches():
            self.tasks_consumed += self.tasks_per_step
            yield batch
        if self._num_batches_left() == 0:
            self.epoch += 1
            self.tasks_consumed = 0

    def close(self) -> None:
        """Stops the worker processes now (a no-op without workers or when none run).

        Persistent workers otherwise stop when the loader is garbage-collected, and a
        collection of the reference cycle they sit in can stall about 5 seconds per
        worker (PyTorch's shutdown waits that long for a worker that never gets its
        stop signal). The loader starts new workers if it is iterated again.
        """
        iterator = getattr(self._loader, "_iterator", None)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._loader._iterator = None

    def __enter__(self) -> BatchMetaDataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """`{"epoch", "tasks_consumed", "seed", "num_tasks_per_epoch", "order", "version"}`.

        `tasks_consumed` counts the tasks of the epoch that all ranks together have been
        given; it is the same on every rank (see `metadist.data.position`).
        """
        return position_state(self.epoch, self.tasks_consumed, self.seed, self.dealer)

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continues from `state`, also one saved with another world size or batch size.

        Raises:
            ValueError: a state from another seed or split size, or a bad position.
        """
        self.epoch, self.tasks_consumed = read_position_state(
            state, self.seed, self.dealer, self.split
        )


def _data_loader(loader: BatchMetaDataLoader, settings: LoaderSettings) -> DataLoader:
    """The `torch.utils.data.DataLoader` computing `loader`'s batches (one item each).

    Raises:
        ValueError: persistent_workers or prefetch_factor without workers.
    """
    kwargs: dict[str, Any] = {}
    if settings.num_workers > 0:
        kwargs["persistent_workers"] = settings.persistent_workers
        kwargs["multiprocessing_context"] = settings.multiprocessing_context
        if settings.prefetch_factor is not None:
            kwargs["prefetch_factor"] = settings.prefetch_factor
    elif settings.persistent_workers or settings.prefetch_factor is not None:
        raise ValueError(
            "persistent_workers and prefetch_factor need num_workers > 0, "
            f"got num_workers={settings.num_workers}"
        )
    return DataLoader(
        _TaskBatches(loader.sampler),
        batch_size=None,
        sampler=_PlanSampler(loader),
        num_workers=settings.num_workers,
        pin_memory=settings.pin_memory,
        collate_fn=_identity,
        **kwargs,
    )
