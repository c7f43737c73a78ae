"""Which units (entities or entity time chunks) each split and each rank gets.

`StratifiedTaskPartitioner` splits units into meta-train / meta-val / meta-test,
stratified and seeded (the draw: `metadist.data.meta_split`), and deals each epoch's
global task order to ranks (one `UnitDealer` per split: `metadist.data.dealing`, with the
orders in `metadist.data.orders` and the choice of rank per task in
`metadist.data.colouring`). The names of those modules are importable from here too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metadist.data.dealing import Deal, UnitDealer
from metadist.data.meta_split import SPLITS, check_fractions, draw_meta_split
from metadist.data.orders import DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW_BLOCKS, ORDERS
from metadist.data.seeding import check_seed

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_WINDOW_BLOCKS",
    "ORDERS",
    "SPLITS",
    "Deal",
    "StratifiedTaskPartitioner",
    "UnitDealer",
]

_SPLIT_TAGS = {"train": 0x7261696E, "val": 0x76616C, "test": 0x74657374}


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
        self.unit_strata = _check_unit_strata(unit_strata)
        self.seed = check_seed(seed)
        self.fractions = check_fractions(fractions)
        pinned = _pinned_mask(pinned_test_units, self.num_units, self.fractions)
        self.pinned_test_units = np.flatnonzero(pinned)
        by = (
            self.unit_strata
            if split_strata is None
            else _check_split_strata(split_strata, self.num_units)
        )
        drawn = draw_meta_split(by, pinned, unit_groups, self.fractions, self.seed)
        self.merged_strata = drawn.merged_strata
        self.num_groups = drawn.num_groups
        self._split_of = drawn.split_of
        self._dealers = {
            name: UnitDealer(
                np.flatnonzero(drawn.split_of == i),
                self.unit_strata[drawn.split_of == i],
                seed=self.seed,
                tag=_SPLIT_TAGS[name],
            )
            for i, name in enumerate(SPLITS)
        }

    @property
    def num_units(self) -> int:
        return int(len(self.unit_strata))

    def dealer(self, split: str) -> UnitDealer:
        """The `UnitDealer` of `split` ("train", "val" or "test").

        Raises:
            ValueError: `split` is not one of them.
        """
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

        See `UnitDealer.deal`: `start` is in [0, n], and fewer tasks left than a round (a
        start at the end) deal no round.

        Raises:
            ValueError: world_size larger than the split's tasks, or bad arguments.
        """
        dealer = self.dealer(split)
        if world_size > dealer.num_units:  # not one round of the split: never a deal
            raise ValueError(
                f"world_size={world_size} is larger than the {dealer.num_units} tasks of "
                f"split {split!r}"
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
        """`(units [M], positions [M])` that rank `rank` gets; see `deal`.

        Raises:
            ValueError: `rank` not in `0..world_size - 1`, or a bad `split`.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
        deal = self.deal(split, epoch, world_size, start=start, num_rounds=num_rounds)
        return deal.units[rank], deal.positions[rank]


def _check_unit_strata(unit_strata: np.ndarray) -> np.ndarray:
    """`[num_units]` int64 stratum codes; `ValueError` unless a non-empty 1-d integer array."""
    strata = np.asarray(unit_strata)
    if strata.ndim != 1 or not np.issubdtype(strata.dtype, np.integer):
        raise ValueError(
            f"unit_strata must be a 1-d integer array, got shape {strata.shape} "
            f"dtype {strata.dtype}"
        )
    if len(strata) == 0:
        raise ValueError("unit_strata is empty: there are no units to partition")
    return strata.astype(np.int64)


def _pinned_mask(
    pinned_test_units: Sequence[int] | np.ndarray | None,
    num_units: int,
    fractions: tuple[float, float, float],
) -> np.ndarray:
    """`[num_units]` bool, the units pinned to the test split (checked to exist)."""
    pinned = np.zeros(num_units, dtype=bool)
    if pinned_test_units is None:
        return pinned
    given = np.asarray(pinned_test_units)
    if given.size and not np.issubdtype(given.dtype, np.integer):
        raise ValueError(f"pinned_test_units must be integer unit indices, got dtype {given.dtype}")
    pins = given.astype(np.int64).reshape(-1)
    bad = pins[(pins < 0) | (pins >= num_units)]
    if len(bad):
        raise ValueError(f"pinned_test_units {bad[:5].tolist()} are outside 0..{num_units - 1}")
    if fractions[2] == 0 and len(pins):
        raise ValueError("pinned_test_units given but fractions[2] (test) is 0")
    pinned[pins] = True
    return pinned


def _check_split_strata(split_strata: np.ndarray, num_units: int) -> np.ndarray:
    """`[num_units]` int64 codes the meta-split is stratified by, one per unit."""
    by = np.asarray(split_strata)
    if by.shape != (num_units,) or not np.issubdtype(by.dtype, np.integer):
        raise ValueError(
            f"split_strata must be {num_units} integer codes, one per unit, got shape "
            f"{by.shape} dtype {by.dtype}"
        )
    return by.astype(np.int64)
