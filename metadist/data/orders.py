"""An epoch's global task order: the units of a split, shuffled as a function of a seed.

The `"random"` order shuffles a split's units, strata interleaved evenly. The `"blocked"`
order is for stores larger than the memory the page cache can use: units, in file order,
are cut into *blocks* of about `block_bytes` of the store; the blocks are shuffled, taken
`window_blocks` at a time, and the tasks of a window are a random interleaving of its
blocks in which every block keeps its file order. A stretch of batches then reads
`window_blocks` regions of the file, each front to back, instead of pages all over it.
"""

from __future__ import annotations

import numpy as np

ORDERS = ("random", "blocked")
DEFAULT_BLOCK_BYTES = 32 << 20
DEFAULT_WINDOW_BLOCKS = 16


def interleaved_order(
    units: np.ndarray, strata: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """`[n]` `units` shuffled, with the strata interleaved evenly.

    Stratum s's i-th unit sits near fraction (i + offset_s) / n_s of the order, so every
    batch is close to stratified; units within a stratum are shuffled.

    Args:
        units: `[n]` int64 unit indices.
        strata: `[n]` int64 stratum code of each of `units`.
        rng: the epoch's generator.
    """
    n = len(units)
    shuffled = rng.permutation(n)
    strata = strata[shuffled]
    by_stratum = np.argsort(strata, kind="stable")
    codes, first, counts = np.unique(strata[by_stratum], return_index=True, return_counts=True)
    if len(codes) == 1:
        return units[shuffled]
    rank_in_stratum = np.empty(n, dtype=np.int64)
    rank_in_stratum[by_stratum] = np.arange(n) - np.repeat(first, counts)
    stratum_slot = np.searchsorted(codes, strata)
    offsets = rng.random(len(codes))
    key = (rank_in_stratum + offsets[stratum_slot]) / counts[stratum_slot]
    # stable on the shuffled sequence: equal keys keep a random order
    return units[shuffled[np.argsort(key, kind="stable")]]


def blocked_order(
    units: np.ndarray, block_of: np.ndarray, window_blocks: int, rng: np.random.Generator
) -> np.ndarray:
    """`[n]` `units` in shuffled blocks, `window_blocks` at a time, each window a uniformly
    random interleaving of its blocks in file order.

    Args:
        units: `[n]` sorted int64 unit indices.
        block_of: `[n]` non-decreasing block index of each of `units` (see `cut_blocks`).
        window_blocks: blocks interleaved at a time.
        rng: the epoch's generator.
    """
    num_blocks = int(block_of[-1]) + 1 if len(block_of) else 0
    place = np.empty(num_blocks, dtype=np.int64)
    place[rng.permutation(num_blocks)] = np.arange(num_blocks)
    window = place[block_of] // window_blocks
    # Each block's units take its random keys in increasing order (block_of is
    # non-decreasing over the sorted units), so a block is read front to back while
    # the merge by key mixes the blocks of a window uniformly.
    keys = rng.random(len(units))
    keys = keys[np.lexsort((keys, block_of))]
    return units[np.lexsort((keys, window))]


def cut_blocks(sizes: np.ndarray, block_bytes: int) -> np.ndarray:
    """`[n]` block index of each unit: a unit belongs to the block of `block_bytes`
    in which it starts, counting bytes in file order (blocks numbered 0, 1, ...)."""
    starts = np.cumsum(sizes) - sizes
    return np.unique(starts // block_bytes, return_inverse=True)[1].astype(np.int64)


def block_starts(block_of: np.ndarray) -> np.ndarray:
    """Indices where a new block begins in the non-decreasing `block_of`."""
    return np.flatnonzero(np.diff(block_of, prepend=-1))
