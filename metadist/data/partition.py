"""Which units (entities or entity time chunks) each split and each rank gets.

`StratifiedTaskPartitioner` splits units into meta-train / meta-val / meta-test,
stratified and seeded, and deals each epoch's global task order to ranks.

Dealing. An epoch's global order is a permutation of a split's units that depends on
(seed, epoch) only. Position `p` in it is one integer: the number of tasks consumed so far
by all ranks together. From a start position, the order is cut into *rounds* of
`world_size` consecutive positions and every rank gets exactly one task of every round, so
after any number of rounds the tasks consumed are exactly a prefix of the order — which is
what makes a checkpoint one integer, also when the world size changes on resume. Inside a
round, which rank gets which task is chosen so that every stratum is dealt round-robin:
each rank gets ⌊n_s / W⌋ or ⌈n_s / W⌉ of the n_s tasks of stratum s (an equitable edge
colouring of the rounds × stratum-blocks bipartite multigraph, de Werra 1971). A tail of
fewer than `world_size` tasks (or whatever does not fill a whole number of batches, see the
loader) is not dealt in that epoch; the next epoch reshuffles everything.

Orders. The `"random"` order shuffles a split's units, strata interleaved evenly. The
`"blocked"` order is for stores larger than the memory the page cache can use: units, in
file order, are cut into *blocks* of about `block_bytes` of the store; the blocks are
shuffled, taken `window_blocks` at a time, and the tasks of a window are a random
interleaving of its blocks in which every block keeps its file order. A stretch of
batches then reads `window_blocks` regions of the file, each front to back, instead of
pages all over it. Dealing is the same for both orders, so every promise above holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SPLITS = ("train", "val", "test")
_SPLIT_TAGS = {"train": 0x7261696E, "val": 0x76616C, "test": 0x74657374}
_TAG_PARTITION = 0x5041525449
_TAG_ORDER = 0x4F52444552
_TAG_BLOCKED = 0x424C4F434B
ORDERS = ("random", "blocked")
DEFAULT_BLOCK_BYTES = 32 << 20
DEFAULT_WINDOW_BLOCKS = 16


def _rng(seed: int, *tags: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), *tags])))


def _check_seed(seed: int, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {seed!r}")
    return int(seed)


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
        order: "random" or "blocked" (see the module docstring).
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
        self.seed = _check_seed(seed)
        self.tag = int(tag)
        self._order_cache: tuple[int, np.ndarray] | None = None
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.order = order
        self.block_bytes = _check_positive(block_bytes, "block_bytes")
        self.window_blocks = _check_positive(window_blocks, "window_blocks")
        self.block_of: np.ndarray | None = None
        if order == "blocked":
            if unit_bytes is None:
                raise ValueError("order='blocked' needs unit_bytes, the store bytes of each unit")
            sizes = np.asarray(unit_bytes, dtype=np.int64)
            if sizes.shape != units.shape or np.any(sizes < 0):
                raise ValueError(
                    f"unit_bytes must be {len(units)} non-negative sizes, got shape {sizes.shape}"
                )
            self.block_of = _cut_blocks(sizes[by_unit], self.block_bytes)

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

        Strata are interleaved evenly (stratum s's i-th unit sits near fraction
        (i + offset_s) / n_s of the order), so every batch is close to stratified; units
        within a stratum are shuffled.
        """
        epoch = _check_seed(epoch, "epoch")
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        if self.block_of is not None:
            order = self._blocked_order(epoch)
            self._order_cache = (epoch, order)
            return order
        n = self.num_units
        rng = _rng(self.seed, _TAG_ORDER, self.tag, epoch)
        shuffled = rng.permutation(n)
        strata = self.strata[shuffled]
        by_stratum = np.argsort(strata, kind="stable")
        codes, first, counts = np.unique(strata[by_stratum], return_index=True, return_counts=True)
        if len(codes) == 1:
            order = self.units[shuffled]
        else:
            rank_in_stratum = np.empty(n, dtype=np.int64)
            rank_in_stratum[by_stratum] = np.arange(n) - np.repeat(first, counts)
            stratum_slot = np.searchsorted(codes, strata)
            offsets = rng.random(len(codes))
            key = (rank_in_stratum + offsets[stratum_slot]) / counts[stratum_slot]
            # stable on the shuffled sequence: equal keys keep a random order
            order = self.units[shuffled[np.argsort(key, kind="stable")]]
        self._order_cache = (epoch, order)
        return order

    def _blocked_order(self, epoch: int) -> np.ndarray:
        """The blocked order of `epoch`: shuffled blocks, `window_blocks` at a time, each
        window a uniformly random interleaving of its blocks in file order."""
        assert self.block_of is not None
        rng = _rng(self.seed, _TAG_BLOCKED, self.tag, epoch)
        place = np.empty(self.num_blocks, dtype=np.int64)
        place[rng.permutation(self.num_blocks)] = np.arange(self.num_blocks)
        window = place[self.block_of] // self.window_blocks
        # Each block's units take its random keys in increasing order (block_of is
        # non-decreasing over the sorted units), so a block is read front to back while
        # the merge by key mixes the blocks of a window uniformly.
        keys = rng.random(self.num_units)
        keys = keys[np.lexsort((keys, self.block_of))]
        return self.units[np.lexsort((keys, window))]

    def block_rows(self, unit_first_row: np.ndarray, unit_num_rows: np.ndarray) -> np.ndarray:
        """`[num_blocks, 2]` first and end store row of every block, given every unit's
        (of the sampler, indexed by unit) first row and number of rows."""
        assert self.block_of is not None
        first = unit_first_row[self.units]
        end = first + unit_num_rows[self.units]
        rows = np.empty((self.num_blocks, 2), dtype=np.int64)
        rows[:, 0] = np.minimum.reduceat(first, _block_starts(self.block_of))
        rows[:, 1] = np.maximum.reduceat(end, _block_starts(self.block_of))
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
        order = self.epoch_order(epoch)
        positions = start + np.arange(num_rounds * world_size, dtype=np.int64)
        dealt_units = order[positions]
        if world_size == 1:
            return Deal(units=dealt_units[None, :], positions=positions[None, :])
        dealt_strata = self.strata[np.searchsorted(self.units, dealt_units)]
        colour = _equitable_colouring(dealt_strata, world_size)
        slot = np.arange(len(positions)) // world_size * world_size + colour
        by_rank = np.empty(len(positions), dtype=np.int64)
        by_rank[slot] = np.arange(len(positions))
        grid = by_rank.reshape(num_rounds, world_size).T
        return Deal(units=dealt_units[grid].copy(), positions=positions[grid].copy())


def _check_positive(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _cut_blocks(sizes: np.ndarray, block_bytes: int) -> np.ndarray:
    """`[n]` block index of each unit: a unit belongs to the block of `block_bytes`
    in which it starts, counting bytes in file order (blocks numbered 0, 1, ...)."""
    starts = np.cumsum(sizes) - sizes
    return np.unique(starts // block_bytes, return_inverse=True)[1].astype(np.int64)


def _block_starts(block_of: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.diff(block_of, prepend=-1))


def _equitable_colouring(strata: np.ndarray, world_size: int) -> np.ndarray:
    """Ranks (colours) for a sequence cut into rounds of `world_size` consecutive items.

    Every round gets each colour once; within each stratum, every run of `world_size`
    consecutive items of that stratum (a block) gets distinct colours. That is a proper
    edge colouring with `world_size` colours of the bipartite multigraph rounds × blocks,
    whose degrees are at most `world_size`, so one exists (König); it is built greedily
    and repaired with alternating (Kempe) paths where the greedy choice is blocked.

    Args:
        strata: `[R * W]` stratum code of each item in order.
        world_size: W.

    Returns:
        `[R * W]` int64 colours in 0..W-1.
    """
    num_items = len(strata)
    w = world_size
    if w == 1 or num_items == 0:
        return np.zeros(num_items, dtype=np.int64)
    by_stratum = np.argsort(strata, kind="stable")
    _, first, counts = np.unique(strata[by_stratum], return_index=True, return_counts=True)
    index_in_stratum = np.empty(num_items, dtype=np.int64)
    index_in_stratum[by_stratum] = np.arange(num_items) - np.repeat(first, counts)
    blocks_per_stratum = -(-counts // w)
    block_base = np.concatenate(([0], np.cumsum(blocks_per_stratum)[:-1]))
    stratum_slot = np.empty(num_items, dtype=np.int64)
    stratum_slot[by_stratum] = np.repeat(np.arange(len(counts)), counts)
    block = (block_base[stratum_slot] + index_in_stratum // w).tolist()
    num_rounds = num_items // w
    num_blocks = int(blocks_per_stratum.sum())
    # at_round[u][c] / at_block[v][c]: the item of colour c at that node, or -1.
    at_round = [[-1] * w for _ in range(num_rounds)]
    at_block = [[-1] * w for _ in range(num_blocks)]
    colour = [-1] * num_items
    item_round = [i // w for i in range(num_items)]
    for item in range(num_items):
        u, v = item_round[item], block[item]
        ru, bv = at_round[u], at_block[v]
        # The first colour free at both ends if there is one; otherwise swap the two
        # colours along an alternating path so that one becomes free at both.
        chosen = -1
        for c in range(w):
            if ru[c] < 0 and bv[c] < 0:
                chosen = c
                break
        if chosen < 0:
            a = ru.index(-1)  # free at the round, used at the block
            b = bv.index(-1)  # free at the block, used at the round
            path = []
            node_is_block, node, want = True, v, a
            while True:
                table = at_block if node_is_block else at_round
                nxt = table[node][want]
                if nxt < 0:
                    break
                path.append(nxt)
                node = item_round[nxt] if node_is_block else block[nxt]
                node_is_block = not node_is_block
                want = b if want == a else a
            for e in path:
                at_round[item_round[e]][colour[e]] = -1
                at_block[block[e]][colour[e]] = -1
            for e in path:
                colour[e] = b if colour[e] == a else a
                at_round[item_round[e]][colour[e]] = e
                at_block[block[e]][colour[e]] = e
            chosen = a
        colour[item] = chosen
        ru[chosen] = item
        bv[chosen] = item
    return np.asarray(colour, dtype=np.int64)


class StratifiedTaskPartitioner:
    """Splits units into train/val/test by stratum and deals each epoch to ranks.

    Args:
        unit_strata: `[num_units]` int64 stratum code of every unit (e.g.
            `sampler.unit_strata()`).
        seed: the split and every epoch's order are functions of this seed (a different
            seed gives a different split, e.g. one per hyper-parameter trial).
        fractions: (train, val, test) shares, non-negative, summing to 1. Each stratum is
            split by largest remainders, and every split with a positive share gets at
            least one unit of every stratum.
        pinned_test_units: unit indices that must be in the test split (e.g. a fixed
            evaluation set); the other units of their strata fill the remaining shares.
        unit_groups: optional `[num_units]` group key of every unit; the units of a group
            go to the same split (e.g. `sampler.unit_entity` with time-chunk units, to
            hold out whole entities, or each unit's class, for class-disjoint few-shot
            splits). Stratification and the largest-remainder counts are then over
            groups; every group must lie in one split stratum.
        split_strata: optional `[num_units]` codes the meta-split is stratified by
            (default `unit_strata`; e.g. entity labels, or all zeros to split groups
            without stratifying). Dealing within a split is always stratified by
            `unit_strata`.

    Raises:
        ValueError: bad fractions, fewer units in all than splits with a positive share,
            pinned units out of range, or pins that leave a stratum no train unit.

    Strata with fewer units (or groups) than splits with a positive share are drawn
    together, as one remainder stratum (`merged_strata` lists their codes; empty when
    every stratum is large enough, and the split is then as it always was).

    Example:
        >>> part = StratifiedTaskPartitioner(sampler.unit_strata(), seed=0)
        >>> part.units("val")                      # sorted unit indices of meta-val
        >>> deal = part.deal("train", epoch=3, world_size=4)
        >>> deal.units[rank]                       # rank's tasks of epoch 3, in order
    """

    def __init__(
        self,
        unit_strata: np.ndarray,
        *,
        seed: int,
        fractions: Sequence[float] = (0.8, 0.1, 0.1),
        pinned_test_units: Sequence[int] | np.ndarray | None = None,
        unit_groups: np.ndarray | None = None,
        split_strata: np.ndarray | None = None,
    ) -> None:
        strata = np.asarray(unit_strata)
        if strata.ndim != 1 or not np.issubdtype(strata.dtype, np.integer):
            raise ValueError(
                f"unit_strata must be a 1-d integer array, got shape {strata.shape} "
                f"dtype {strata.dtype}"
            )
        if len(strata) == 0:
            raise ValueError("unit_strata is empty: there are no units to partition")
        self.unit_strata = strata.astype(np.int64)
        self.seed = _check_seed(seed)
        self.fractions = _check_fractions(fractions)
        num_units = len(strata)
        pinned = np.zeros(num_units, dtype=bool)
        if pinned_test_units is not None:
            pins = np.asarray(pinned_test_units, dtype=np.int64).reshape(-1)
            bad = pins[(pins < 0) | (pins >= num_units)]
            if len(bad):
                raise ValueError(
                    f"pinned_test_units {bad[:5].tolist()} are outside 0..{num_units - 1}"
                )
            if self.fractions[2] == 0 and len(pins):
                raise ValueError("pinned_test_units given but fractions[2] (test) is 0")
            pinned[pins] = True
        self.pinned_test_units = np.flatnonzero(pinned)
        if split_strata is None:
            by = self.unit_strata
        else:
            by = np.asarray(split_strata)
            if by.shape != strata.shape or not np.issubdtype(by.dtype, np.integer):
                raise ValueError(
                    f"split_strata must be {num_units} integer codes, one per unit, got shape "
                    f"{by.shape} dtype {by.dtype}"
                )
            by = by.astype(np.int64)
        # The split is drawn over items: units, or groups of units that must stay together.
        if unit_groups is None:
            item_of_unit = np.arange(num_units)
            item_strata, item_pinned = by, pinned
        else:
            groups = np.asarray(unit_groups)
            if groups.shape != strata.shape:
                raise ValueError(
                    f"unit_groups must have one entry per unit ({num_units}), got shape "
                    f"{groups.shape}"
                )
            _, first_unit, item_of_unit = np.unique(groups, return_index=True, return_inverse=True)
            item_strata = by[first_unit]
            mixed = item_strata[item_of_unit] != by
            if mixed.any():
                unit = int(np.flatnonzero(mixed)[0])
                raise ValueError(
                    f"unit_groups: group {groups[unit]!r} has units of strata "
                    f"{item_strata[item_of_unit[unit]]} and {by[unit]}; a group "
                    "must lie in one stratum"
                )
            item_pinned = np.zeros(len(first_unit), dtype=bool)
            item_pinned[item_of_unit[pinned]] = True
        item_strata, self.merged_strata = _merge_small_strata(item_strata, self.fractions)
        split_of_item = np.empty(len(item_strata), dtype=np.int64)
        rng = _rng(self.seed, _TAG_PARTITION)
        what = "units" if unit_groups is None else "unit groups"
        self.num_groups = len(item_strata)
        for code in np.unique(item_strata):
            members = np.flatnonzero(item_strata == code)
            counts = _split_counts(len(members), self.fractions, int(code))
            is_pinned = item_pinned[members]
            num_pinned = int(is_pinned.sum())
            if num_pinned > counts[2]:
                excess = num_pinned - counts[2]
                counts[2] = num_pinned
                for split in (0, 1):
                    minimum = 1 if self.fractions[split] > 0 else 0
                    take = min(excess, counts[split] - minimum)
                    counts[split] -= take
                    excess -= take
                if excess:
                    raise ValueError(
                        f"pinned_test_units pins {num_pinned} of the {len(members)} {what} of "
                        f"stratum {int(code)}, leaving too few for train/val"
                    )
            free = rng.permutation(members[~is_pinned])
            split_of_item[members[is_pinned]] = 2
            num_free_test = counts[2] - num_pinned
            split_of_item[free[: counts[0]]] = 0
            split_of_item[free[counts[0] : counts[0] + counts[1]]] = 1
            split_of_item[free[counts[0] + counts[1] : counts[0] + counts[1] + num_free_test]] = 2
        split_of = split_of_item[item_of_unit]
        self._split_of = split_of
        self._dealers = {
            name: UnitDealer(
                np.flatnonzero(split_of == i),
                self.unit_strata[split_of == i],
                seed=self.seed,
                tag=_SPLIT_TAGS[name],
            )
            for i, name in enumerate(SPLITS)
        }

    @property
    def num_units(self) -> int:
        return int(len(self.unit_strata))

    def dealer(self, split: str) -> UnitDealer:
        """The `UnitDealer` of `split` ("train", "val" or "test")."""
        if split not in self._dealers:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self._dealers[split]

    def units(self, split: str) -> np.ndarray:
        """`[n_split]` sorted unit indices of `split`."""
        return self.dealer(split).units

    def epoch_order(self, split: str, epoch: int) -> np.ndarray:
        """`[n_split]` the global task order of `split` in `epoch` (from (seed, epoch))."""
        return self.dealer(split).epoch_order(epoch)

    def deal(
        self,
        split: str,
        epoch: int,
        world_size: int,
        *,
        start: int = 0,
        num_rounds: int | None = None,
    ) -> Deal:
        """Deals `split`'s epoch to `world_size` ranks from global position `start`.

        See `UnitDealer.deal`.

        Raises:
            ValueError: world_size larger than the tasks left, or bad arguments.
        """
        dealer = self.dealer(split)
        left = dealer.num_units - start
        if world_size > left:
            raise ValueError(
                f"world_size={world_size} is larger than the {left} tasks of split {split!r} "
                f"left from position {start} (the split has {dealer.num_units} units)"
            )
        return dealer.deal(epoch, world_size, start=start, num_rounds=num_rounds)

    def rank_slice(
        self,
        split: str,
        epoch: int,
        rank: int,
        world_size: int,
        *,
        start: int = 0,
        num_rounds: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`(units [M], positions [M])` that rank `rank` gets; see `deal`."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
        deal = self.deal(split, epoch, world_size, start=start, num_rounds=num_rounds)
        return deal.units[rank], deal.positions[rank]


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    values = tuple(float(f) for f in fractions)
    if len(values) != 3:
        raise ValueError(f"fractions must be (train, val, test), got {fractions!r}")
    if any(f < 0 for f in values) or abs(sum(values) - 1.0) > 1e-6:
        raise ValueError(f"fractions must be non-negative and sum to 1, got {values}")
    if values[0] == 0:
        raise ValueError(f"fractions[0] (train) must be > 0, got {values}")
    return values


def _merge_small_strata(
    strata: np.ndarray, fractions: tuple[float, float, float]
) -> tuple[np.ndarray, list[int]]:
    """Strata with fewer items than splits with a positive share, drawn as one stratum.

    A stratum of one series cannot put a series in every split; rather than refusing the
    whole run, such strata are pooled into one remainder stratum for the split draw (and
    that into the smallest stratum large enough, if the remainder is still too small).
    Returns the codes to draw by and the merged codes (empty when none were merged: the
    draw is then exactly as before).
    """
    needed = sum(f > 0 for f in fractions)
    codes, counts = np.unique(strata, return_counts=True)
    small = codes[counts < needed]
    if len(small) == 0 or len(small) == len(codes) and counts.sum() < needed:
        return strata, []
    merged = strata.copy()
    is_small = np.isin(strata, small)
    target = int(small.min())
    if int(is_small.sum()) < needed:
        large = codes[counts >= needed]
        target = int(large[np.argmin(counts[counts >= needed])])
    merged[is_small] = target
    return merged, [int(c) for c in small]


def _split_counts(n: int, fractions: tuple[float, float, float], code: int) -> list[int]:
    """Largest-remainder counts of n units over the splits, at least 1 per positive share."""
    positive = [f > 0 for f in fractions]
    if n < sum(positive):
        raise ValueError(
            f"stratum {code} has {n} unit(s), too few for fractions {fractions}: every split "
            f"with a positive share needs at least one unit of every stratum "
            f"({sum(positive)} needed)"
        )
    exact = [n * f for f in fractions]
    counts = [int(np.floor(x)) for x in exact]
    remainders = sorted(range(3), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in remainders[: n - sum(counts)]:
        counts[i] += 1
    for i in range(3):
        while positive[i] and counts[i] == 0:
            donor = max(range(3), key=lambda j: counts[j])
            counts[donor] -= 1
            counts[i] += 1
    return counts
