"""The meta-split: which units go to meta-train, meta-val and meta-test.

The split is drawn over *items*: units, or groups of units that must stay together (all
time chunks of one entity, all series of one class). Items are stratified; each stratum
is split by largest remainders, every split with a positive share gets at least one item
of every stratum, and pinned test items are placed first. Strata too small for that are
drawn together as one remainder stratum. The draw is a function of the seed only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metadist.data.seeding import TAG_PARTITION, seeded_rng

SPLITS = ("train", "val", "test")

Fractions = tuple[float, float, float]


@dataclass(frozen=True)
class MetaSplit:
    """A drawn meta-split.

    Attributes:
        split_of: `[num_units]` int64 index into `SPLITS` of every unit's split.
        merged_strata: codes of the strata too small for the splits, drawn together as
            one remainder stratum (empty when none were).
        num_groups: items the split was drawn over (units, or groups of units).
    """

    split_of: np.ndarray
    merged_strata: list[int]
    num_groups: int


@dataclass(frozen=True)
class _Items:
    """The units seen as the items the split is drawn over.

    Attributes:
        item_of_unit: `[num_units]` item index of every unit.
        strata: `[num_items]` stratum code of every item.
        pinned: `[num_items]` whether the item holds a pinned test unit.
        what: "units" or "unit groups", for messages.
    """

    item_of_unit: np.ndarray
    strata: np.ndarray
    pinned: np.ndarray
    what: str


def draw_meta_split(
    split_strata: np.ndarray,
    pinned: np.ndarray,
    unit_groups: np.ndarray | None,
    fractions: Fractions,
    seed: int,
) -> MetaSplit:
    """Draws every unit's split.

    Args:
        split_strata: `[num_units]` int64 code the split is stratified by.
        pinned: `[num_units]` bool, units that must be in the test split.
        unit_groups: optional `[num_units]` group key of every unit (a group goes to one
            split and must lie in one stratum).
        fractions: checked (train, val, test) shares (see `check_fractions`).
        seed: the draw is a function of this seed only.

    Returns:
        The `MetaSplit`.

    Raises:
        ValueError: a group across strata, a stratum with fewer items than splits with a
            positive share, or pins that leave a stratum no train/val item.
    """
    items = _items(split_strata, pinned, unit_groups)
    item_strata, merged = merge_small_strata(items.strata, fractions)
    split_of_item = np.full(len(item_strata), -1, dtype=np.int64)
    rng = seeded_rng(seed, TAG_PARTITION)
    for code in np.unique(item_strata):
        members = np.flatnonzero(item_strata == code)
        is_pinned = items.pinned[members]
        counts = _pinned_counts(
            len(members), int(is_pinned.sum()), fractions, int(code), items.what
        )
        free = rng.permutation(members[~is_pinned])
        split_of_item[members[is_pinned]] = 2
        num_free_test = counts[2] - int(is_pinned.sum())
        split_of_item[free[: counts[0]]] = 0
        split_of_item[free[counts[0] : counts[0] + counts[1]]] = 1
        split_of_item[free[counts[0] + counts[1] : counts[0] + counts[1] + num_free_test]] = 2
    if (split_of_item < 0).any():  # the counts of every stratum sum to its items
        raise AssertionError("meta split: an item was given no split")
    return MetaSplit(
        split_of=split_of_item[items.item_of_unit],
        merged_strata=merged,
        num_groups=len(item_strata),
    )


def _items(split_strata: np.ndarray, pinned: np.ndarray, unit_groups: np.ndarray | None) -> _Items:
    """Units as items, or their groups (checked to lie in one stratum each) as items."""
    num_units = len(split_strata)
    if unit_groups is None:
        return _Items(np.arange(num_units), split_strata, pinned, "units")
    groups = np.asarray(unit_groups)
    if groups.shape != split_strata.shape:
        raise ValueError(
            f"unit_groups must have one entry per unit ({num_units}), got shape {groups.shape}"
        )
    _, first_unit, item_of_unit = np.unique(groups, return_index=True, return_inverse=True)
    item_strata = split_strata[first_unit]
    mixed = item_strata[item_of_unit] != split_strata
    if mixed.any():
        unit = int(np.flatnonzero(mixed)[0])
        raise ValueError(
            f"unit_groups: group {groups[unit]!r} has units of strata "
            f"{item_strata[item_of_unit[unit]]} and {split_strata[unit]}; a group "
            "must lie in one stratum"
        )
    item_pinned = np.zeros(len(first_unit), dtype=bool)
    item_pinned[item_of_unit[pinned]] = True
    return _Items(item_of_unit, item_strata, item_pinned, "unit groups")


def _pinned_counts(
    num_members: int, num_pinned: int, fractions: Fractions, code: int, what: str
) -> list[int]:
    """Items of stratum `code` per split, the test count raised to hold its pinned items
    (taken from train, then val, down to one item each where their share is positive)."""
    counts = split_counts(num_members, fractions, code)
    if num_pinned <= counts[2]:
        return counts
    excess = num_pinned - counts[2]
    counts[2] = num_pinned
    for split in (0, 1):
        minimum = 1 if fractions[split] > 0 else 0
        take = min(excess, counts[split] - minimum)
        counts[split] -= take
        excess -= take
    if excess:
        raise ValueError(
            f"pinned_test_units pins {num_pinned} of the {num_members} {what} of "
            f"stratum {code}, leaving too few for train/val"
        )
    return counts


def check_fractions(fractions: Sequence[float]) -> Fractions:
    """`fractions` as (train, val, test) floats, non-negative, summing to 1, train > 0."""
    values = tuple(float(f) for f in fractions)
    if len(values) != 3:
        raise ValueError(f"fractions must be (train, val, test), got {fractions!r}")
    if not all(math.isfinite(f) for f in values):
        raise ValueError(f"fractions must be finite numbers, got {values}")
    if any(f < 0 for f in values) or abs(sum(values) - 1.0) > 1e-6:
        raise ValueError(f"fractions must be non-negative and sum to 1, got {values}")
    if values[0] == 0:
        raise ValueError(f"fractions[0] (train) must be > 0, got {values}")
    return values


def merge_small_strata(strata: np.ndarray, fractions: Fractions) -> tuple[np.ndarray, list[int]]:
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


def split_counts(n: int, fractions: Fractions, code: int) -> list[int]:
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
    # fractions may sum to 1 within 1e-6 (`check_fractions`), so the floors may miss n by
    # more than the 3 units a remainder each can give, or pass it: the difference is
    # spread evenly over the positive shares, the odd units in remainder order (a count
    # below 0 is then made up from the largest)
    receivers = [i for i in remainders if positive[i]]
    whole, extra = divmod(n - sum(counts), len(receivers))
    for rank, i in enumerate(receivers):
        counts[i] += whole + (rank < extra)
    while any(c < 0 for c in counts):
        low = min(range(3), key=lambda j: counts[j])
        donor = max(range(3), key=lambda j: counts[j])
        counts[low] += 1
        counts[donor] -= 1
    for i in range(3):
        while positive[i] and counts[i] == 0:
            donor = max(range(3), key=lambda j: counts[j])
            counts[donor] -= 1
            counts[i] += 1
    return counts
