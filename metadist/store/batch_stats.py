"""Per-batch work of the ingest scan: entity codes, per-entity moments of a batch, and
the values beyond what a store can hold.

Everything here works on one record batch and is safe in worker threads, except
`Registry.add`, which only the main thread calls (in input order, so that codes are
given in order of first sight whatever the number of workers).
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa

from metadist.store.arrow import int64_array, to_numpy
from metadist.store.settings import MAX_TIME, NO_TIME

# A batch is "grouped by entity" when each of its entities is one run of rows and there
# is at most one run per this many rows (plus a few); its sums are then taken over
# slices, and only such batches are copied raw.
ROWS_PER_RUN = 64


class Registry:
    """Maps keys (entity ids, stratum names) to dense codes in order of first sight.

    Parquet hands string columns over as dictionary arrays; the mapping of a batch's
    dictionary is cached, since consecutive batches of a row group share it.
    """

    def __init__(self, as_str: bool = False) -> None:
        self.codes: dict[Any, int] = {}
        self.as_str = as_str
        self._last_dictionary: pa.Array | None = None
        self._last_map: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.codes)

    def keys(self) -> list[Any]:
        return list(self.codes)

    def add(self, dictionary: pa.Array, found: np.ndarray | None = None) -> np.ndarray:
        """`[U]` int64 code of each entry of `dictionary`, adding new keys; a key
        repeated in `dictionary` gets the same code each time.

        Args:
            found: codes already looked up (by a worker, see `lookup`), -1 where the key
                was not known then; only those are looked up again.
        """
        last = self._last_dictionary
        if (
            last is not None
            and self._last_map is not None
            and len(last) == len(dictionary)
            and last.equals(dictionary)
        ):
            return self._last_map
        codes = self.codes
        if found is not None:
            mapping = found.copy()
            missing = np.flatnonzero(mapping < 0)
            if missing.size:
                keys = keys_of(dictionary.take(int64_array(missing)), self.as_str)
                for position, key in zip(missing.tolist(), keys, strict=True):
                    mapping[position] = codes.setdefault(key, len(codes))
        else:
            keys = keys_of(dictionary, self.as_str)
            listed = list(map(codes.get, keys))
            if None in listed:
                for position, code in enumerate(listed):
                    if code is None:
                        listed[position] = codes.setdefault(keys[position], len(codes))
            mapping = np.array(listed, np.int64)
        self._last_dictionary, self._last_map = dictionary, mapping
        return mapping


def lookup(codes: dict[Any, int], dictionary: pa.Array) -> np.ndarray:
    """`[U]` int64 code of each entry of `dictionary`, -1 for keys not seen yet (a pure
    read of `codes`, safe in worker threads while the main thread adds keys: a key
    is there with its final code or not at all)."""
    keys = dictionary.to_pylist()
    return np.fromiter(map(codes.get, keys, repeat(-1)), np.int64, len(keys))


def keys_of(dictionary: pa.Array, as_str: bool) -> list[Any]:
    keys = dictionary.to_pylist()
    return [str(key) for key in keys] if as_str else keys


def dictionary_of(column: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """`([N] int64 positions in the dictionary, [U] dictionary)` of a column."""
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    return to_numpy(column.indices).astype(np.int64), column.dictionary


def used_entries(local: np.ndarray, dictionary: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """`(local, dictionary)` with the dictionary reduced to the entries that rows use.

    A Parquet column written from a categorical keeps the whole category list in every
    row group: a batch of 167 entities may come with a dictionary of all 20,720. Only
    the entries in use are looked up, given statistics and registered (an entity that
    has no row is not an entity of the input)."""
    used = np.bincount(local, minlength=len(dictionary)) > 0
    if used.all():
        return local, dictionary
    entries = np.flatnonzero(used)
    position = np.full(len(dictionary), -1, np.int64)
    position[entries] = np.arange(entries.size)
    return position[local], dictionary.take(int64_array(entries))


def first_false(mask: np.ndarray) -> int:
    return int(np.argmin(mask))


def nonfinite(values: list[np.ndarray]) -> dict[int, np.ndarray]:
    """`{column: [N] finite mask}` for the columns holding NaN/inf (a sum is the cheap
    first test; only a non-finite sum pays for the exact mask)."""
    masks = {}
    for j, column in enumerate(values):
        if not np.isfinite(column.sum()):
            finite = np.isfinite(column)
            if not finite.all():
                masks[j] = finite
    return masks


def runs_of(local: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`([K] first row, [K] end row)` of the runs of one entity in a batch, if each entity
    of the batch is one run and runs are long (input grouped by entity), else None."""
    if local.size == 0:
        return None
    starts = np.flatnonzero(local[1:] != local[:-1]) + 1
    if starts.size + 1 > 4 + local.size // ROWS_PER_RUN:
        return None
    starts = np.concatenate([[0], starts])
    if len(np.unique(local[starts])) != starts.size:
        return None
    return starts, np.append(starts[1:], local.size)


def moments(
    local: np.ndarray,
    times: np.ndarray,
    values: list[np.ndarray],
    masks: dict[int, np.ndarray],
    num_local: int,
) -> tuple[np.ndarray, ...]:
    """`([U] rows, [U] first time, [U] last time, [U, C] count, mean, M2)` of a batch
    whose rows come in any order."""
    rows = np.bincount(local, minlength=num_local)
    first = np.full(num_local, MAX_TIME, np.int64)
    last = np.full(num_local, NO_TIME, np.int64)
    np.minimum.at(first, local, times)
    np.maximum.at(last, local, times)
    num_columns = len(values)
    count = np.empty((num_local, num_columns))
    total = np.empty((num_local, num_columns))
    # rows holding NaN/inf per column: few, so they are set aside by position rather
    # than masked in full-length passes (the sums are the same, bit for bit: each entity's
    # values are still added in row order, with 0.0 in place of a non-finite one)
    bad = {j: np.flatnonzero(~finite) for j, finite in masks.items()}
    for j, column in enumerate(values):
        if j not in bad:
            count[:, j] = rows
            total[:, j] = np.bincount(local, weights=column, minlength=num_local)
        else:
            count[:, j] = rows - np.bincount(local[bad[j]], minlength=num_local)
            kept = np.array(column, dtype=np.float64)
            kept[bad[j]] = 0.0
            total[:, j] = np.bincount(local, weights=kept, minlength=num_local)
    mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    by_column = np.ascontiguousarray(mean.T)  # [C, U]: contiguous gathers per column
    m2 = total  # reused: the totals are no longer needed
    deviation = np.empty(local.size)
    for j, column in enumerate(values):
        # mode "clip": `local` is in range; the default ("raise") buffers `out` first
        np.take(by_column[j], local, out=deviation, mode="clip")
        np.subtract(column, deviation, out=deviation)
        if j in bad:
            deviation[bad[j]] = 0.0
        np.multiply(deviation, deviation, out=deviation)
        m2[:, j] = np.bincount(local, weights=deviation, minlength=num_local)
    return rows, first, last, count, mean, m2


def run_moments(
    local: np.ndarray,
    times: np.ndarray,
    values: list[np.ndarray],
    masks: dict[int, np.ndarray],
    num_local: int,
    starts: np.ndarray,
    ends: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """`moments` of a batch whose entities each come as one run of rows `[starts,
    ends)`: sums over contiguous slices instead of scattered ones."""
    entity = local[starts]
    lengths = ends - starts
    rows = np.zeros(num_local, np.int64)
    rows[entity] = lengths
    first = np.full(num_local, MAX_TIME, np.int64)
    last = np.full(num_local, NO_TIME, np.int64)
    first[entity] = np.minimum.reduceat(times, starts)
    last[entity] = np.maximum.reduceat(times, starts)
    num_columns = len(values)
    count = np.zeros((num_local, num_columns))
    mean = np.zeros((num_local, num_columns))
    m2 = np.zeros((num_local, num_columns))
    for j, column in enumerate(values):
        finite = masks.get(j)
        if finite is None:
            run_count = lengths.astype(np.float64)
            run_total = np.add.reduceat(column, starts, dtype=np.float64)
        else:
            run_count = np.add.reduceat(finite, starts, dtype=np.float64)
            run_total = np.add.reduceat(np.where(finite, column, 0.0), starts, dtype=np.float64)
        run_mean = np.divide(
            run_total, run_count, out=np.zeros_like(run_total), where=run_count > 0
        )
        deviation = column - np.repeat(run_mean, lengths)
        if finite is not None:
            deviation = np.where(finite, deviation, 0.0)
        np.multiply(deviation, deviation, out=deviation)
        count[entity, j] = run_count
        mean[entity, j] = run_mean
        m2[entity, j] = np.add.reduceat(deviation, starts)
    return rows, first, last, count, mean, m2


# Values a store cannot hold: float32 stops at 3.4e38 (the store holds values unscaled with
# --scaling none), and the statistics of a scaled store sum squares in float64, which stop
# at 1.8e308 (values beyond 1e150).
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_SQUARE_SAFE = 1e150


def beyond_store_range(
    values: list[np.ndarray], scaling: str
) -> tuple[int, int, float, str] | None:
    """`(column, row, limit, why)` of the first finite value beyond what the store can
    hold, or None."""
    if scaling == "none":
        limit, why = _FLOAT32_MAX, "the store holds float32 values and this one would be inf"
    else:
        limit = _SQUARE_SAFE
        why = (
            f"its square overflows the {scaling} scaling statistics (the scaled store would hold "
            "inf or NaN); rescale the column before ingesting"
        )
    first = None
    for j, column in enumerate(values):
        if column.dtype.itemsize <= 4:  # float32 input holds nothing beyond either limit
            continue
        if column.size == 0 or -limit <= np.fmin.reduce(column) <= np.fmax.reduce(column) <= limit:
            continue  # the common case, in two reductions (fmin/fmax skip NaN)
        over = np.abs(column) > limit  # NaN compares False, inf is the NaN policy's
        over &= np.isfinite(column)
        if over.any():
            row = int(np.argmax(over))
            if first is None or row < first[1]:
                first = (j, row, limit, why)
    return first
