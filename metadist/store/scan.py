"""Pass 1 of `metadist ingest`: validate the input and gather what the plan needs.

Workers decode row groups and reduce each record batch to batch-local results
(`BatchScan`: per-entity row counts, first and last times, count/mean/M2 per column,
the batch's stratum and label values, and any error found). The main thread takes
them in input order, gives entities their codes and merges the moments (Chan et al.'s
formula), so statistics and error messages are the same for any number of workers.

When every value column is float32, the workers also copy each batch's raw rows into
`values.bin` / `times.bin` at their position in the input. If the input turns out to be
in store order already (entities in sorted id order, each entity's rows together and
in time order, nothing dropped), those bytes are final but for scaling, and the ingest
skips the second Parquet read and the ordering pass (see `finish_in_place`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metadist.store import sources
from metadist.store.arrow import to_numpy
from metadist.store.files import RawFile
from metadist.store.parallel import ordered_streams
from metadist.store.progress import Bar
from metadist.store.scaler import merge_moments
from metadist.store.settings import MAX_TIME, NO_TIME, IngestSettings

# A batch is "grouped by entity" when each of its entities is one run of rows and there
# is at most one run per this many rows (plus a few); its sums are then taken over
# slices, and only such batches are copied raw.
_ROWS_PER_RUN = 64
# Entity codes of pass 1's batches are kept for pass 2 up to this many bytes.
_BATCH_MAP_BYTES = 64 << 20


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
        if last is not None and len(last) == len(dictionary) and last.equals(dictionary):
            return self._last_map
        codes = self.codes
        if found is not None:
            mapping = found.copy()
            missing = np.flatnonzero(mapping < 0)
            if missing.size:
                keys = _keys(dictionary.take(pa.array(missing)), self.as_str)
                for position, key in zip(missing.tolist(), keys, strict=True):
                    mapping[position] = codes.setdefault(key, len(codes))
        else:
            keys = _keys(dictionary, self.as_str)
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


def _keys(dictionary: pa.Array, as_str: bool) -> list[Any]:
    keys = dictionary.to_pylist()
    return [str(key) for key in keys] if as_str else keys


def dictionary_of(column: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """`([N] int64 positions in the dictionary, [U] dictionary)` of a column."""
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    return to_numpy(column.indices).astype(np.int64), column.dictionary


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


def null_error(file: sources.SourceFile, offset: int, column: pa.Array, name: str) -> str | None:
    position = sources.first_null(column)
    if position is None:
        return None
    return f"{file.path}: row {offset + position}: column {name!r} is null"


@dataclass
class Category:
    """A stratum or label column within one batch."""

    error: str | None = None  # null, or not constant within the batch
    dictionary: pa.Array | None = None
    first: np.ndarray | None = None  # [U] position in `dictionary` per batch entity


@dataclass
class BatchScan:
    """What a worker found in one record batch; codes are local to the batch."""

    file: sources.SourceFile
    offset: int
    num_rows: int
    entity_error: str | None = None
    dictionary: pa.Array | None = None  # [U] entity ids, each once
    codes: np.ndarray | None = None  # [U] their codes where known when scanned, else -1
    first_row: np.ndarray | None = None  # [U] first row of each entity in the batch
    categories: dict[str, Category] = field(default_factory=dict)
    late_error: str | None = None  # null time, or NaN under --nan error
    rows: np.ndarray | None = None  # [U] rows kept
    first: np.ndarray | None = None  # [U] first time
    last: np.ndarray | None = None
    count: np.ndarray | None = None  # [U, C]
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None
    runs: tuple[np.ndarray, ...] | None = None  # raw copy: (local, input row, length,
    # first time, last time) of each run of one entity; None if not copied

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held (for the memory budget of the workers' results)."""
        arrays = [self.first_row, self.codes, self.rows, self.first, self.last, self.count]
        arrays.append(self.mean)
        arrays += [self.m2, *(self.runs or ())]
        for category in self.categories.values():
            arrays.append(category.first)
        return 1024 + sum(a.nbytes for a in arrays if a is not None)


class ScanResult:
    """Per-entity accumulators of pass 1, growing as new entities appear."""

    _FILL = {"stratum": -1, "label": -1, "first_time": MAX_TIME, "last_time": NO_TIME}

    def __init__(self, num_columns: int) -> None:
        self.entities = Registry()
        self.category_names = {"stratum": Registry(as_str=True), "label": Registry(as_str=True)}
        self.capacity = 1024
        self.rows = np.zeros(self.capacity, np.int64)
        self.count = np.zeros((self.capacity, num_columns))
        self.mean = np.zeros((self.capacity, num_columns))
        self.m2 = np.zeros((self.capacity, num_columns))
        for name, fill in self._FILL.items():
            setattr(self, name, np.full(self.capacity, fill, np.int64))
        # Entity codes of each batch's dictionary, by (unit, batch): pass 2 reads the same
        # batches again and reuses them instead of hashing every id a second time.
        self.batch_maps: dict[tuple[int, int], np.ndarray] = {}
        self.batch_map_bytes = 0
        # Runs of the raw copy: lists of [K] arrays (entity code, input row, length,
        # first time, last time); `raw` turns False when the input is not in store order.
        self.raw = False
        self.runs: list[tuple[np.ndarray, ...]] = []
        self.num_runs = 0
        self.seconds = 0.0

    def reserve(self, size: int) -> None:
        if size <= self.capacity:
            return
        capacity = max(size, 2 * self.capacity)
        for name in ("rows", "count", "mean", "m2", *self._FILL):
            old = getattr(self, name)
            new = np.full((capacity,) + old.shape[1:], self._FILL.get(name, 0), old.dtype)
            new[: self.capacity] = old
            setattr(self, name, new)
        self.capacity = capacity


class _Scanner:
    """The work of pass 1 on one batch (in a worker) and its merge (in the main thread)."""

    def __init__(self, settings: IngestSettings, result: ScanResult, raw: tuple | None):
        self.settings = settings
        self.result = result
        self.raw_files = raw  # (values RawFile, times RawFile) or None
        self.abandon = threading.Event()  # stop copying raw rows: not in store order
        # the last entity dictionary each unit checked for repeated entries (a row
        # group's batches share one)
        self._last_dictionary: dict[sources.Unit, pa.Array] = {}

    # ---- in a worker ----------------------------------------------------------------------
    def unit_batches(self, unit: sources.Unit):
        settings = self.settings
        try:
            for offset, batch in sources.iter_unit(
                unit, settings.scan_columns, settings.batch_size, settings.dictionary_columns
            ):
                yield self.scan_batch(unit, offset, batch)
        finally:
            self._last_dictionary.pop(unit, None)

    def scan_batch(
        self, unit: sources.Unit | None, offset: int, batch: pa.RecordBatch
    ) -> BatchScan:
        settings = self.settings
        columns = settings.columns
        file = unit.file if unit is not None else None
        found = BatchScan(file, offset, batch.num_rows)
        entity_column = batch.column(columns.entity)
        found.entity_error = null_error(file, offset, entity_column, columns.entity)
        if found.entity_error:
            return found
        local, dictionary = dictionary_of(entity_column)
        last = self._last_dictionary.get(unit)
        if last is None or not (len(last) == len(dictionary) and last.equals(dictionary)):
            if len(pc.unique(dictionary)) != len(dictionary):  # an entry repeated
                local, dictionary = dictionary_of(entity_column.dictionary_decode())
            else:
                self._last_dictionary[unit] = dictionary
        found.dictionary = dictionary
        found.codes = lookup(self.result.entities.codes, dictionary)
        num_local = len(dictionary)
        if columns.stratum is not None or columns.label is not None:
            found.first_row = np.full(num_local, -1, np.int64)
            found.first_row[local[::-1]] = np.arange(local.size - 1, -1, -1)
        for role, name in (("stratum", columns.stratum), ("label", columns.label)):
            if name is not None:
                found.categories[role] = self._category(
                    file, offset, batch, role, name, local, num_local
                )
                if found.categories[role].error:
                    return found
        time_column = batch.column(columns.time)
        found.late_error = null_error(file, offset, time_column, columns.time)
        if found.late_error:
            return found
        times = sources.to_int64_time(time_column)
        values = sources.float_columns(batch, settings.value_names, keep_float32=True)
        masks = nonfinite(values)
        if masks and settings.nan == "error":
            col = min(masks, key=lambda j: (first_false(masks[j]), j))
            row = first_false(masks[col])
            name = settings.value_names[col]
            entity = _keys(dictionary[local[row] : local[row] + 1], False)[0]
            shown = "null" if not batch.column(name)[row].is_valid else values[col][row]
            found.late_error = (
                f"{file.path}: row {offset + row}: column {name!r} of entity {entity!r} is "
                f"{shown} (NaN, inf or null is an error under --nan error; use --nan ffill or "
                "--nan drop)"
            )
            return found
        if masks and settings.nan == "drop":
            keep = np.logical_and.reduce(list(masks.values()))
            local, times, values = local[keep], times[keep], [x[keep] for x in values]
            masks = {}
            self.abandon.set()  # rows dropped: the input rows are not the store rows
        runs = _runs(local)
        if self.raw_files is not None and not self.abandon.is_set():
            found.runs = self._copy_raw(unit, offset, local, times, batch, runs)
        if runs is not None:
            moments = _run_moments(local, times, values, masks, num_local, *runs)
        else:
            moments = _moments(local, times, values, masks, num_local)
        found.rows, found.first, found.last, found.count, found.mean, found.m2 = moments
        return found

    def _category(
        self,
        file: sources.SourceFile,
        offset: int,
        batch: pa.RecordBatch,
        role: str,
        name: str,
        local: np.ndarray,
        num_local: int,
    ) -> Category:
        column = batch.column(name)
        error = null_error(file, offset, column, name)
        if error:
            return Category(error=error)
        value, dictionary = dictionary_of(column)
        first = np.full(num_local, -1, np.int64)
        first[local] = value  # any row's value represents the entity in this batch
        bad = np.flatnonzero(first[local] != value)
        if bad.size:
            row = int(bad[0])
            names = _keys(dictionary, True)
            entity = self._entity_key(batch, local, row)
            return Category(
                error=f"{file.path}: row {offset + row}: {role} column {name!r} is not "
                f"constant within entity {entity!r}: {names[value[row]]!r} here, "
                f"{names[first[local[row]]]!r} on another row of this file"
            )
        return Category(dictionary=dictionary, first=first)

    def _entity_key(self, batch: pa.RecordBatch, local: np.ndarray, row: int) -> Any:
        _, dictionary = dictionary_of(batch.column(self.settings.columns.entity))
        return _keys(dictionary[local[row] : local[row] + 1], False)[0]

    def _copy_raw(
        self,
        unit: sources.Unit,
        offset: int,
        local: np.ndarray,
        times: np.ndarray,
        batch: pa.RecordBatch,
        runs: tuple[np.ndarray, np.ndarray] | None,
    ) -> tuple[np.ndarray, ...] | None:
        """Writes the batch's raw rows at their input position if they come in runs of one
        entity with increasing times; returns the runs, or None (and stops all copying)."""
        if runs is None:
            self.abandon.set()
            return None
        starts, ends = runs
        steps = np.diff(times)
        steps[starts[1:] - 1] = 1  # a new run may start at any time
        if (steps <= 0).any():
            self.abandon.set()
            return None
        raw = sources.raw_float32_rows(batch, self.settings.value_names)
        if raw is None:
            self.abandon.set()
            return None
        row = unit.input_row + (offset - unit.first_row)
        values_file, times_file = self.raw_files
        values_file.write(row, raw)
        times_file.write(row, times)
        return local[starts], row + starts, ends - starts, times[starts], times[ends - 1]

    # ---- in the main thread ----------------------------------------------------------------
    def merge(self, unit: sources.Unit, number: int, found: BatchScan) -> None:
        """Merges one batch's results into the accumulators, raising its errors in the
        order one pass over the input meets them."""
        result = self.result
        if found.entity_error:
            raise ValueError(found.entity_error)
        mapping = result.entities.add(found.dictionary, found.codes)
        result.reserve(len(result.entities))
        for role, category in found.categories.items():
            self._merge_category(found, role, category, mapping)
        if found.late_error:
            raise ValueError(found.late_error)
        if result.batch_map_bytes < _BATCH_MAP_BYTES:
            result.batch_maps[(unit.number, number)] = mapping.astype(np.int32)
            result.batch_map_bytes += 4 * mapping.size
        result.rows[mapping] += found.rows
        result.first_time[mapping] = np.minimum(result.first_time[mapping], found.first)
        result.last_time[mapping] = np.maximum(result.last_time[mapping], found.last)
        merged = merge_moments(
            result.count[mapping],
            result.mean[mapping],
            result.m2[mapping],
            found.count,
            found.mean,
            found.m2,
        )
        result.count[mapping], result.mean[mapping], result.m2[mapping] = merged
        if found.runs is not None and result.raw:
            run_local, *rest = found.runs
            result.runs.append((mapping[run_local], *rest))
            result.num_runs += run_local.size
            if result.num_runs > 1024 + 4 * len(result.entities):  # bounded memory
                self.abandon.set()
                result.raw = False
        if found.runs is None:
            result.raw = False
            result.runs = []

    def _merge_category(
        self, found: BatchScan, role: str, category: Category, mapping: np.ndarray
    ) -> None:
        if category.error:
            raise ValueError(category.error)
        result = self.result
        registry = result.category_names[role]
        value_map = registry.add(category.dictionary)
        first = np.where(category.first >= 0, value_map[np.maximum(category.first, 0)], -1)
        known = getattr(result, role)[mapping]
        conflict = np.flatnonzero((first >= 0) & (known >= 0) & (known != first))
        if not conflict.size:
            fresh = (first >= 0) & (known < 0)
            getattr(result, role)[mapping[fresh]] = first[fresh]
            return
        row = int(found.first_row[conflict[0]])
        names = registry.keys()
        entity = result.entities.keys()[mapping[conflict[0]]]
        name = getattr(self.settings.columns, role)
        raise ValueError(
            f"{found.file.path}: row {found.offset + row}: {role} column {name!r} is not "
            f"constant within entity {entity!r}: {names[first[conflict[0]]]!r} "
            f"here, {names[known[conflict[0]]]!r} on an earlier row"
        )


def _runs(local: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`([K] first row, [K] end row)` of the runs of one entity in a batch, if each entity
    of the batch is one run and runs are long (input grouped by entity), else None."""
    if local.size == 0:
        return None
    starts = np.flatnonzero(local[1:] != local[:-1]) + 1
    if starts.size + 1 > 4 + local.size // _ROWS_PER_RUN:
        return None
    starts = np.concatenate([[0], starts])
    if len(np.unique(local[starts])) != starts.size:
        return None
    return starts, np.append(starts[1:], local.size)


def _moments(
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
    for j, column in enumerate(values):
        finite = masks.get(j)
        if finite is None:
            count[:, j] = rows
            total[:, j] = np.bincount(local, weights=column, minlength=num_local)
        else:
            count[:, j] = np.bincount(local, weights=finite, minlength=num_local)
            total[:, j] = np.bincount(
                local, weights=np.where(finite, column, 0.0), minlength=num_local
            )
    mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    by_column = np.ascontiguousarray(mean.T)  # [C, U]: contiguous gathers per column
    m2 = total  # reused: the totals are no longer needed
    for j, column in enumerate(values):
        deviation = column - by_column[j][local]
        finite = masks.get(j)
        if finite is not None:
            deviation = np.where(finite, deviation, 0.0)
        np.multiply(deviation, deviation, out=deviation)
        m2[:, j] = np.bincount(local, weights=deviation, minlength=num_local)
    return rows, first, last, count, mean, m2


def _run_moments(
    local: np.ndarray,
    times: np.ndarray,
    values: list[np.ndarray],
    masks: dict[int, np.ndarray],
    num_local: int,
    starts: np.ndarray,
    ends: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """`_moments` of a batch whose entities each come as one run of rows `[starts,
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


def scan(settings: IngestSettings, bar: Bar, raw: tuple[RawFile, RawFile] | None) -> ScanResult:
    """Pass 1 over every row group of the input, `settings.workers` at a time.

    Args:
        raw: files to copy raw float32 rows into at their input position, or None.

    Raises:
        ValueError: bad input (null entity or time, NaN under `--nan error`, a stratum or
            label not constant within an entity, a corrupt file).
    """
    began = time.perf_counter()
    result = ScanResult(len(settings.value_names))
    result.raw = raw is not None
    scanner = _Scanner(settings, result, raw)
    task = bar.add("scan", settings.num_rows_read)
    numbers: dict[int, int] = {}
    for unit, found in ordered_streams(
        settings.units,
        scanner.unit_batches,
        settings.workers,
        settings.memory_limit,
        lambda found: found.nbytes,
    ):
        number = numbers.get(unit.number, 0)
        numbers[unit.number] = number + 1
        scanner.merge(unit, number, found)
        bar.advance(task, found.num_rows)
    result.seconds = time.perf_counter() - began
    return result
