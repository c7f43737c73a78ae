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

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metadist.store import sources
from metadist.store.batch_stats import (
    Registry,
    beyond_store_range,
    dictionary_of,
    first_false,
    keys_of,
    lookup,
    moments,
    nonfinite,
    run_moments,
    runs_of,
    used_entries,
)
from metadist.store.files import RawFile
from metadist.store.parallel import default_workers, ordered_streams
from metadist.store.progress import Bar
from metadist.store.scaler import merge_moments
from metadist.store.settings import MAX_TIME, NO_TIME, IngestSettings

# Entity codes of pass 1's batches are kept for pass 2 up to this many bytes.
_BATCH_MAP_BYTES = 64 << 20


def null_error(file: sources.SourceFile, offset: int, column: pa.Array, name: str) -> str | None:
    position = sources.first_null(column)
    if position is None:
        return None
    return f"{file.path}: row {offset + position}: column {name!r} is null"


# Pass 1's per-batch numpy work runs one worker at a time on a process with at most this
# many cores (`_Scanner.unit_batches`): measured faster on 2 CPUs (BENCHMARKS.md, Ingest).
SERIAL_BATCH_WORK_CPUS = 2


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
    finite_any: np.ndarray | None = None  # [C] whether each column has a finite value,
    # before --nan drop removes rows (to name a column that has none at all)

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
        self.finite_any = np.zeros(num_columns, bool)  # [C] some finite value seen
        # [capacity] int64 each, filled with `_FILL` (grown together by `reserve`)
        self.stratum = np.full(self.capacity, self._FILL["stratum"], np.int64)
        self.label = np.full(self.capacity, self._FILL["label"], np.int64)
        self.first_time = np.full(self.capacity, self._FILL["first_time"], np.int64)
        self.last_time = np.full(self.capacity, self._FILL["last_time"], np.int64)
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
        # Held by the worker doing a batch's numpy work (see `unit_batches`), where the
        # process has at most SERIAL_BATCH_WORK_CPUS cores; elsewhere nothing is held.
        self.batch_work: contextlib.AbstractContextManager = (
            threading.Lock()
            if default_workers() <= SERIAL_BATCH_WORK_CPUS
            else contextlib.nullcontext()
        )

    # ---- in a worker ----------------------------------------------------------------------
    def unit_batches(self, unit: sources.Unit):
        """`BatchScan` of each batch of `unit`, decoded in parallel with the other workers.

        The numpy work on a batch (about 150 short calls, each releasing and retaking the
        GIL) runs one worker at a time: in two threads at once each call waits for the
        GIL to come back from the other thread, and on the 2-CPU machine of BENCHMARKS.md
        two threads did that work slower than one. Decoding (long stretches without the
        GIL) still overlaps it; the main thread's merges take the same lock. Batches that
        copy raw rows are not serialised: their `pwrite` is the larger part of their work
        and runs in parallel. Only where the process has at most `SERIAL_BATCH_WORK_CPUS`
        cores: on more, where it was not measured, the workers run it side by side.
        """
        settings = self.settings
        try:
            for offset, batch in sources.iter_unit(
                unit, settings.scan_columns, settings.batch_size, settings.dictionary_columns
            ):
                copying = self.raw_files is not None and not self.abandon.is_set()
                with contextlib.nullcontext() if copying else self.batch_work:
                    found = self.scan_batch(unit, offset, batch)
                yield found
        finally:
            self._last_dictionary.pop(unit, None)

    def scan_batch(self, unit: sources.Unit, offset: int, batch: pa.RecordBatch) -> BatchScan:
        settings = self.settings
        columns = settings.columns
        file = unit.file
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
        local, dictionary = used_entries(local, dictionary)
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
        try:
            times = sources.to_int64_time(time_column, file.path, offset, columns.time)
        except pa.ArrowInvalid:  # a timestamp or date beyond int64 nanoseconds
            found.late_error = _time_range_error(time_column, file, offset, columns.time)
            return found
        values = sources.float_columns(batch, settings.value_names, keep_float32=True)
        masks = nonfinite(values)
        if masks and settings.nan == "error":
            col = min(masks, key=lambda j: (first_false(masks[j]), j))
            row = first_false(masks[col])
            name = settings.value_names[col]
            entity = keys_of(dictionary[local[row] : local[row] + 1], False)[0]
            shown = "null" if not batch.column(name)[row].is_valid else values[col][row]
            found.late_error = (
                f"{file.path}: row {offset + row}: column {name!r} of entity {entity!r} is "
                f"{shown} (NaN, inf or null is an error under --nan error; use --nan ffill or "
                "--nan drop)"
            )
            return found
        found.finite_any = np.array(
            [j not in masks or bool(masks[j].any()) for j in range(len(values))]
        )
        too_large = beyond_store_range(values, settings.scaling)
        if too_large is not None:
            col, row, limit, why = too_large
            name = settings.value_names[col]
            entity = keys_of(dictionary[local[row] : local[row] + 1], False)[0]
            found.late_error = (
                f"{file.path}: row {offset + row}: column {name!r} of entity {entity!r} is "
                f"{float(values[col][row])!r}, beyond {limit:.4g}: {why}"
            )
            return found
        if masks and settings.nan == "drop":
            keep = np.logical_and.reduce(list(masks.values()))
            local, times, values = local[keep], times[keep], [x[keep] for x in values]
            masks = {}
            self.abandon.set()  # rows dropped: the input rows are not the store rows
        runs = runs_of(local)
        if self.raw_files is not None and not self.abandon.is_set():
            found.runs = self._copy_raw(unit, offset, local, times, batch, runs)
        if runs is not None:
            summary = run_moments(local, times, values, masks, num_local, *runs)
        else:
            summary = moments(local, times, values, masks, num_local)
        found.rows, found.first, found.last, found.count, found.mean, found.m2 = summary
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
            names = keys_of(dictionary, True)
            entity = self._entity_key(batch, local, row)
            return Category(
                error=f"{file.path}: row {offset + row}: {role} column {name!r} is not "
                f"constant within entity {entity!r}: {names[value[row]]!r} here, "
                f"{names[first[local[row]]]!r} on another row of this file"
            )
        return Category(dictionary=dictionary, first=first)

    def _entity_key(self, batch: pa.RecordBatch, local: np.ndarray, row: int) -> Any:
        _, dictionary = dictionary_of(batch.column(self.settings.columns.entity))
        return keys_of(dictionary[local[row] : local[row] + 1], False)[0]

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
        # compared, not subtracted: a difference of times far apart wraps around int64
        increasing = times[1:] > times[:-1]
        increasing[starts[1:] - 1] = True  # a new run may start at any time
        if not increasing.all():
            self.abandon.set()
            return None
        raw = sources.raw_float32_rows(batch, self.settings.value_names)
        if raw is None:
            self.abandon.set()
            return None
        row = unit.input_row + (offset - unit.first_row)
        assert self.raw_files is not None  # only called while copying raw rows
        values_file, times_file = self.raw_files
        values_file.write(row, raw)
        times_file.write(row, times)
        # the times are final if the input proves to be in store order: let the disk take
        # them now, while it would be idle, rather than in the final fsync
        times_file.start_writeback(row, row + times.size)
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
        # a batch without errors has every per-entity result
        assert found.finite_any is not None and found.rows is not None
        assert found.first is not None and found.last is not None
        assert found.count is not None and found.mean is not None and found.m2 is not None
        result.finite_any |= found.finite_any
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
        assert category.first is not None and found.first_row is not None  # no error: set
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


def scan(settings: IngestSettings, bar: Bar, raw: tuple[RawFile, RawFile] | None) -> ScanResult:
    """Pass 1 over every row group of the input, `settings.workers` at a time.

    Args:
        raw: files to copy raw float32 rows into at their input position, or None.

    Raises:
        ValueError: bad input (null entity or time, NaN under `--nan error`, a stratum or
            label not constant within an entity, a corrupt file, a timestamp beyond int64
            nanoseconds, an entity's times further apart than int64 counts).
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
        with scanner.batch_work:  # not interleaved with a worker's calls: see unit_batches
            scanner.merge(unit, number, found)
        bar.advance(task, found.num_rows)
    _check_time_spans(result, settings.columns.time)
    result.seconds = time.perf_counter() - began
    return result


def _check_time_spans(result: ScanResult, name: str) -> None:
    """Refuses an entity whose first and last times are further apart than int64 can
    count: its time steps (`last - first`) would wrap around to negative numbers.

    Raises:
        ValueError: naming the entity, its first and last time and the column.
    """
    num_entities = len(result.entities)
    first, last = result.first_time[:num_entities], result.last_time[:num_entities]
    with np.errstate(over="ignore"):
        span = last - first
    wrapped = np.flatnonzero((result.rows[:num_entities] > 0) & (span < 0))
    if wrapped.size:
        entity = int(wrapped[0])
        raise ValueError(
            f"entity {result.entities.keys()[entity]!r} has times from {int(first[entity])} to "
            f"{int(last[entity])} in column {name!r}: further apart than the int64 range "
            f"({MAX_TIME}), so its time steps would wrap around; shift the times (subtract "
            "an offset) before ingesting"
        )


def _time_range_error(column: pa.Array, file: sources.SourceFile, offset: int, name: str) -> str:
    """The message for the first timestamp or date of a batch beyond int64 nanoseconds."""
    row, shown = sources.first_beyond_nanoseconds(column)
    return (
        f"{file.path}: row {offset + row}: time column {name!r} holds {shown}, beyond the "
        "times a store can keep (int64 nanoseconds since 1970, the years 1677 to 2262)"
    )


# the name `metadist.api.history` imports (the check itself is in batch_stats)
_too_large = beyond_store_range
