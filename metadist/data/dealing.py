"""Dealing an epoch's global task order to ranks, resumably from any position.

An epoch's global order is a permutation of a split's units that depends on (seed, epoch)
only (`metadist.data.orders`). Position `p` in it is one integer: the number of tasks
consumed so far by all ranks together. From a start position, the order is cut into
*rounds* of `world_size` consecutive positions and every rank gets exactly one task of
every round, so after any number of rounds the tasks consumed are exactly a prefix of the
order — which is what makes a checkpoint one integer, also when the world size changes on
resume. Inside a round, which rank gets which task is chosen so that every stratum is dealt
round-robin: each rank gets ⌊n_s / W⌋ or ⌈n_s / W⌉ of the n_s tasks of stratum s
(`metadist.data.colouring`). A tail of fewer than `world_size` tasks (or whatever does not
fill a whole number of batches, see the loader) is not dealt in that epoch; the next epoch
reshuffles everything. Dealing is the same for every order, so every promise above holds
for the random and the blocked order alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from metadist.data.colouring import equitable_colouring
from metadist.data.orders import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_WINDOW_BLOCKS,
    ORDERS,
    block_starts,
    blocked_order,
    cut_blocks,
    interleaved_order,
)
from metadist.data.seeding import TAG_BLOCKED, TAG_ORDER, check_positive, check_seed, seeded_rng


@dataclass(frozen=True)
class Deal:
    """Tasks dealt to every rank from one start position of an epoch.

    Attributes:
        units: `[world_size, num_rounds]` int64; row r is rank r's units in order.
        positions: `[world_size, num_rounds]` int64 positions in the epoch's global order
            (column j holds the positions `start + j*W ... start + (j+1)*W - 1`).
    """

    units: np.ndarray
    positions: np.ndarray

    @property
    def num_rounds(self) -> int:
        return int(self.units.shape[1])


class UnitDealer:
    """Orders a fixed set of units per epoch and deals the order to ranks.

    Args:
        units: `[n]` int64 unit indices (any order; duplicates are an error).
        strata: `[n]` int64 stratum code of each of `units`.
        seed: the order of epoch e is a function of (seed, e, tag) only.
        tag: separates the orders of different splits that share a seed.
        order: "random" or "blocked" (see `metadist.data.orders`).
        unit_bytes: with `order="blocked"`, `[n]` store bytes of each of `units` (in the
            order given); units with consecutive indices are neighbours in the file.
        block_bytes: with `order="blocked"`, a block closes once its units reach this
            many bytes (a unit larger than that is a block of its own).
        window_blocks: with `order="blocked"`, how many blocks are interleaved at a time.

    Raises:
        ValueError: bad shapes, duplicate units, an unknown order, or blocked-order
            settings that are missing or not positive.
    """

    def __init__(
        self,
        units: np.ndarray,
        strata: np.ndarray,
        *,
        seed: int,
        tag: int = 0,
        order: str = "random",
        unit_bytes: np.ndarray | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        window_blocks: int = DEFAULT_WINDOW_BLOCKS,
    ):
        units = np.asarray(units, dtype=np.int64)
        strata = np.asarray(strata, dtype=np.int64)
        if units.ndim != 1 or strata.shape != units.shape:
            raise ValueError(
                f"units and strata must be 1-d of equal length, got {units.shape} and {strata.shape}"
            )
        if len(np.unique(units)) != len(units):
            raise ValueError("units contains duplicates; every unit may be dealt once per epoch")
        by_unit = np.argsort(units, kind="stable")
        self.units = units[by_unit]
        self.strata = strata[by_unit]
        self.seed = check_seed(seed)
        self.tag = int(tag)
        self._order_cache: tuple[int, np.ndarray] | None = None
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.order = order
        self.block_bytes = check_positive(block_bytes, "block_bytes")
        self.window_blocks = check_positive(window_blocks, "window_blocks")
        self.block_of: np.ndarray | None = None
        if order == "blocked":
            if unit_bytes is None:
                raise ValueError("order='blocked' needs unit_bytes, the store bytes of each unit")
            sizes = np.asarray(unit_bytes, dtype=np.int64)
            if sizes.shape != units.shape or np.any(sizes < 0):
                raise ValueError(
                    f"unit_bytes must be {len(units)} non-negative sizes, got shape {sizes.shape}"
                )
            self.block_of = cut_blocks(sizes[by_unit], self.block_bytes)

    def reordered(
        self,
        order: str,
        *,
        unit_bytes: np.ndarray | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        window_blocks: int = DEFAULT_WINDOW_BLOCKS,
    ) -> UnitDealer:
        """The same units, strata, seed and tag dealt in another `order`.

        `unit_bytes` is `[n]` aligned with `self.units` (sorted unit indices).
        """
        return UnitDealer(
            self.units,
            self.strata,
            seed=self.seed,
            tag=self.tag,
            order=order,
            unit_bytes=unit_bytes,
            block_bytes=block_bytes,
            window_blocks=window_blocks,
        )

    @property
    def num_blocks(self) -> int:
        """Blocks of the blocked order (1 for the random order)."""
        if self.block_of is None:
            return 1
        return int(self.block_of[-1]) + 1 if len(self.block_of) else 0

    @property
    def num_units(self) -> int:
        return int(len(self.units))

    def epoch_order(self, epoch: int) -> np.ndarray:
        """`[n]` the units in the global order of `epoch`, a function of (seed, epoch).

        The random order interleaves the strata evenly (see
        `metadist.data.orders.interleaved_order`), so every batch is close to stratified;
        the blocked order keeps each block of the file in file order.
        """
        epoch = check_seed(epoch, "epoch")
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        if self.block_of is not None:
            rng = seeded_rng(self.seed, TAG_BLOCKED, self.tag, epoch)
            order = blocked_order(self.units, self.block_of, self.window_blocks, rng)
        else:
            rng = seeded_rng(self.seed, TAG_ORDER, self.tag, epoch)
            order = interleaved_order(self.units, self.strata, rng)
        self._order_cache = (epoch, order)
        return order

    def block_rows(self, unit_first_row: np.ndarray, unit_num_rows: np.ndarray) -> np.ndarray:
        """`[num_blocks, 2]` first and end store row of every block, given every unit's
        (of the sampler, indexed by unit) first row and number of rows."""
        assert self.block_of is not None
        first = unit_first_row[self.units]
        end = first + unit_num_rows[self.units]
        rows = np.empty((self.num_blocks, 2), dtype=np.int64)
        rows[:, 0] = np.minimum.reduceat(first, block_starts(self.block_of))
        rows[:, 1] = np.maximum.reduceat(end, block_starts(self.block_of))
        return rows

    def deal(
        self, epoch: int, world_size: int, *, start: int = 0, num_rounds: int | None = None
    ) -> Deal:
        """Deals `num_rounds` rounds of `world_size` tasks from position `start`.

        Args:
            epoch: which epoch's order.
            world_size: number of ranks W.
            start: global position to deal from (tasks already consumed this epoch).
            num_rounds: rounds to deal; default all whole rounds left, `(n - start) // W`.

        Returns:
            A `Deal`; each rank gets `num_rounds` tasks, each stratum's count per rank is
            ⌊d_s / W⌋ or ⌈d_s / W⌉ for the d_s tasks of stratum s dealt.

        Raises:
            ValueError: world_size < 1, start outside [0, n], or more rounds than left.
        """
        world_size, num_rounds = self._check_deal(world_size, start, num_rounds)
        order = self.epoch_order(epoch)
        positions = start + np.arange(num_rounds * world_size, dtype=np.int64)
        dealt_units = order[positions]
        if world_size == 1:
            return Deal(units=dealt_units[None, :], positions=positions[None, :])
        dealt_strata = self.strata[np.searchsorted(self.units, dealt_units)]
        colour = equitable_colouring(dealt_strata, world_size)
        slot = np.arange(len(positions)) // world_size * world_size + colour
        by_rank = np.empty(len(positions), dtype=np.int64)
        by_rank[slot] = np.arange(len(positions))
        grid = by_rank.reshape(num_rounds, world_size).T
        return Deal(units=dealt_units[grid].copy(), positions=positions[grid].copy())

    def _check_deal(self, world_size: int, start: int, num_rounds: int | None) -> tuple[int, int]:
        """`(world_size, num_rounds)` of a deal from `start`, checked, the rounds resolved."""
        n = self.num_units
        if isinstance(world_size, bool) or int(world_size) < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        world_size = int(world_size)
        if not 0 <= start <= n:
            raise ValueError(f"start position {start} is outside this epoch's 0..{n} tasks")
        available = (n - start) // world_size
        if num_rounds is None:
            num_rounds = available
        if num_rounds < 0 or num_rounds > available:
            raise ValueError(
                f"cannot deal {num_rounds} rounds of world_size={world_size} from position "
                f"{start}: only {n - start} of the epoch's {n} tasks are left"
            )
        return world_size, num_rounds
