"""Seeded random streams of the partitioner and the dealer, and the seed check they share."""

from __future__ import annotations

import numpy as np

# Tags that keep the streams drawn from one seed apart.
TAG_PARTITION = 0x5041525449
TAG_ORDER = 0x4F52444552
TAG_BLOCKED = 0x424C4F434B


def seeded_rng(seed: int, *tags: int) -> np.random.Generator:
    """The generator of `(seed, *tags)`: the same numbers on every machine and run."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), *tags])))


def check_seed(seed: int, name: str = "seed") -> int:
    """`seed` as an int; `ValueError` naming `name` unless it is a non-negative integer
    below 2**64 (the task seeds keep its low 64 bits: larger seeds would alias)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {seed!r}")
    if seed >= 2**64:
        raise ValueError(f"{name} must be below 2**64, got {seed!r}")
    return int(seed)


# the largest value numpy's int64 arithmetic (block cutting, offsets) holds
INT64_MAX = 2**63 - 1


def check_positive(value: int, name: str) -> int:
    """`value` as an int; `ValueError` naming `name` unless it is a positive integer that
    fits an int64 (larger values overflow the int64 arrays they are used with)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value > INT64_MAX:
        raise ValueError(f"{name} must be at most 2**63-1 (an int64), got {value!r}")
    return int(value)
