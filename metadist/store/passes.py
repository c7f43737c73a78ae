"""The three passes of `metadist ingest` over the Parquet input (see `ingest.py`).

Placement without sorting. Pass 1 records each entity's first and last time. An entity
whose row count fits an arithmetic progression between them (`span = (rows - 1) *
step` for an integral step) is *regular*: pass 2 writes each of its rows straight to its
final, time-sorted slot `start + (t - first) / step`, and pass 3 only checks that every
slot holds the expected time (a duplicate time leaves a slot unfilled). Other entities
are written in arrival order and sorted by pass 3. Regular series, the common case, are
never sorted, so ingest costs little more than reading the Parquet twice.
"""

from __future__ import annotations

import os
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metadist.store import sources
from metadist.store.arrow import int64_array, string_array, to_numpy
from metadist.store.files import MappedFile, start_writeback
from metadist.store.format import (
    CHECKSUM_ALGORITHM,
    ENTITY_STATS_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_FILE,
    METADATA_FILE,
    TIMES_DTYPE,
    TIMES_FILE,
    VALUES_DTYPE,
    VALUES_FILE,
    Checksum,
    fsync_path,
    write_json,
)
from metadist.store.progress import Bar
from metadist.store.scaler import merge_moments, scale_of

_MAX_DROPPED_LISTED = 1000
_NO_TIME = np.iinfo(np.int64).min
_MAX_TIME = np.iinfo(np.int64).max


class _Demoted(Exception):
    """Entities (store indices) that pass 1 took for regular but whose times are not."""

    def __init__(self, entities: np.ndarray) -> None:
        super().__init__(f"{len(entities)} entities are not regular")
        self.entities = entities


class _Registry:
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

    def encode(self, column: pa.Array, *, add: bool) -> tuple[np.ndarray, np.ndarray]:
        """`([N] int64 row codes local to the batch, [U] int64 global code of each)`.

        With `add=False`, keys never seen get code -1.
        """
        if not pa.types.is_dictionary(column.type):
            column = column.dictionary_encode()
        dictionary = column.dictionary
        local = to_numpy(column.indices).astype(np.int64)
        last = self._last_dictionary
        if last is not None and len(last) == len(dictionary) and last.equals(dictionary):
            return local, self._last_map
        keys = dictionary.to_pylist()
        if self.as_str:
            keys = [str(key) for key in keys]
        codes = self.codes
        if add:
            found = list(map(codes.get, keys))
            if None in found:
                for position, code in enumerate(found):
                    if code is None:
                        found[position] = codes.setdefault(keys[position], len(codes))
            mapping = np.array(found, np.int64)
        else:
            mapping = np.fromiter(map(codes.get, keys, repeat(-1)), np.int64, len(keys))
        if len(np.unique(mapping)) != len(mapping):  # a dictionary with repeated entries
            return self.encode(column.dictionary_decode(), add=add)
        self._last_dictionary, self._last_map = dictionary, mapping
        return local, mapping


class _Growing:
    """Per-entity accumulators of pass 1, growing as new entities appear."""

    _FILL = {"stratum": -1, "label": -1, "first_time": _MAX_TIME, "last_time": _NO_TIME}

    def __init__(self, num_columns: int) -> None:
        self.capacity = 1024
        self.rows = np.zeros(self.capacity, np.int64)
        self.count = np.zeros((self.capacity, num_columns))
        self.mean = np.zeros((self.capacity, num_columns))
        self.m2 = np.zeros((self.capacity, num_columns))
        for name, fill in self._FILL.items():
            setattr(self, name, np.full(self.capacity, fill, np.int64))

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


def _first_false(mask: np.ndarray) -> int:
    return int(np.argmin(mask))


class IngestJob:
    """State shared by the three passes of one ingest."""

    def __init__(
        self,
        files: list[sources.SourceFile],
        schema: pa.Schema,
        columns: sources.Columns,
        scaling: str,
        nan: str,
        min_length: int,
        batch_size: int,
    ) -> None:
        self.files = files
        self.columns = columns
        self.value_names = list(columns.value_columns)
        self.scaling = scaling
        self.nan = nan
        self.min_length = min_length
        self.batch_size = batch_size
        self.time_kind = sources.time_kind(schema.field(columns.time).type)
        self.dictionary_columns = [
            name
            for name in (columns.entity, columns.stratum, columns.label)
            if name is not None
            and (pa.types.is_string(schema.field(name).type)
                 or pa.types.is_large_string(schema.field(name).type))
        ]  # fmt: skip
        self.entities = _Registry()
        self.category_names = {"stratum": _Registry(as_str=True), "label": _Registry(as_str=True)}
        self.stats = _Growing(len(self.value_names))
        self.num_rows_read = sum(f.num_rows for f in files)
        self.timings: dict[str, float] = {}
        self._finite_somewhere = np.zeros(len(self.value_names), bool)
        # Entity codes of each batch's dictionary, as found by pass 1, in batch order:
        # pass 2 reads the same batches again and reuses them instead of hashing every
        # batch's entity ids a second time. None where pass 1 had to re-encode.
        self._batch_maps: list[tuple[int, np.ndarray | None]] = []

    def _batches(self, names: list[str]):
        """`(file, first_row, batch)` over all files, decoded one step ahead in a thread."""
        return sources.prefetch(
            sources.iter_all_batches(self.files, names, self.batch_size, self.dictionary_columns)
        )

    def _reject_nulls(self, file: sources.SourceFile, offset: int, column: pa.Array, name: str):
        position = sources.first_null(column)
        if position is not None:
            raise ValueError(f"{file.path}: row {offset + position}: column {name!r} is null")

    def _nonfinite(self, values: list[np.ndarray]) -> dict[int, np.ndarray]:
        """`{column: [N] finite mask}` for the columns holding NaN/inf (a sum is the cheap
        first test; only a non-finite sum pays for the exact mask)."""
        masks = {}
        for j, column in enumerate(values):
            if not np.isfinite(column.sum()):
                finite = np.isfinite(column)
                if not finite.all():
                    masks[j] = finite
        return masks

    # ---- pass 1 -------------------------------------------------------------------------
    def scan(self, bar: Bar) -> None:
        began = time.perf_counter()
        columns = self.columns
        read = list(dict.fromkeys([columns.entity, columns.time, *self.value_names]))
        read += [c for c in (columns.stratum, columns.label) if c is not None and c not in read]
        task = bar.add("scan", self.num_rows_read)
        for file, offset, batch in self._batches(read):
            self._scan_batch(file, offset, batch)
            bar.advance(task, batch.num_rows)
        self.timings["scan_s"] = time.perf_counter() - began

    def _scan_batch(self, file: sources.SourceFile, offset: int, batch: pa.RecordBatch) -> None:
        columns = self.columns
        entity_column = batch.column(columns.entity)
        self._reject_nulls(file, offset, entity_column, columns.entity)
        local, mapping = self.entities.encode(entity_column, add=True)
        direct = pa.types.is_dictionary(entity_column.type) and len(mapping) == len(
            entity_column.dictionary
        )
        self._batch_maps.append((batch.num_rows, mapping.astype(np.int32) if direct else None))
        stats = self.stats
        stats.reserve(len(self.entities))
        for role, name in (("stratum", columns.stratum), ("label", columns.label)):
            if name is not None:
                self._check_constant(file, offset, batch, role, name, local, mapping)
        time_column = batch.column(columns.time)
        self._reject_nulls(file, offset, time_column, columns.time)
        times = sources.to_int64_time(time_column, file.path, offset, columns.time)
        values = sources.float_columns(batch, self.value_names)
        masks = self._nonfinite(values)
        for j in range(len(values)):  # whether each column has a finite value anywhere
            self._finite_somewhere[j] |= j not in masks or bool(masks[j].any())
        if masks and self.nan == "error":
            col = min(masks, key=lambda j: (_first_false(masks[j]), j))
            row = _first_false(masks[col])
            name = self.value_names[col]
            entity = self.entities.keys()[mapping[local[row]]]
            shown = "null" if not batch.column(name)[row].is_valid else values[col][row]
            raise ValueError(
                f"{file.path}: row {offset + row}: column {name!r} of entity {entity!r} is "
                f"{shown} (NaN, inf or null is an error under --nan error; use --nan ffill or "
                "--nan drop)"
            )
        if masks and self.nan == "drop":
            keep = np.logical_and.reduce(list(masks.values()))
            local, times, values = local[keep], times[keep], [x[keep] for x in values]
            masks = {}
        num_local = len(mapping)
        rows = np.bincount(local, minlength=num_local)
        stats.rows[mapping] += rows
        first = np.full(num_local, _MAX_TIME, np.int64)
        last = np.full(num_local, _NO_TIME, np.int64)
        np.minimum.at(first, local, times)
        np.maximum.at(last, local, times)
        stats.first_time[mapping] = np.minimum(stats.first_time[mapping], first)
        stats.last_time[mapping] = np.maximum(stats.last_time[mapping], last)
        # Moments of the batch per (entity, column) as [U, C] arrays, merged in one step.
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
        merged = merge_moments(
            stats.count[mapping], stats.mean[mapping], stats.m2[mapping], count, mean, m2
        )
        stats.count[mapping], stats.mean[mapping], stats.m2[mapping] = merged

    def _check_constant(
        self,
        file: sources.SourceFile,
        offset: int,
        batch: pa.RecordBatch,
        role: str,
        name: str,
        local: np.ndarray,
        mapping: np.ndarray,
    ) -> None:
        column = batch.column(name)
        self._reject_nulls(file, offset, column, name)
        registry = self.category_names[role]
        value_local, value_map = registry.encode(column, add=True)
        value = value_map[value_local]
        first = np.full(len(mapping), -1, np.int64)
        first[local] = value  # any row's value represents the entity in this batch
        names = registry.keys()
        bad = np.flatnonzero(first[local] != value)
        if bad.size:
            row = int(bad[0])
            other = names[first[local[row]]]
            where = "another row of this file"
        else:
            known = getattr(self.stats, role)[mapping]
            conflict = np.flatnonzero((first >= 0) & (known >= 0) & (known != first))
            if not conflict.size:
                fresh = (first >= 0) & (known < 0)
                getattr(self.stats, role)[mapping[fresh]] = first[fresh]
                return
            row = int(np.flatnonzero(local == conflict[0])[0])
            other = names[known[conflict[0]]]
            where = "an earlier row"
        entity = self.entities.keys()[mapping[local[row]]]
        raise ValueError(
            f"{file.path}: row {offset + row}: {role} column {name!r} is not constant within "
            f"entity {entity!r}: {names[value[row]]!r} here, {other!r} on {where}"
        )

    # ---- between the passes -------------------------------------------------------------
    def plan(self) -> None:
        """Decides which entities are kept, their order, offsets, statistics and whether
        their rows can be placed directly."""
        stats = self.stats
        num_seen = len(self.entities)
        keys = self.entities.keys()
        rows = stats.rows[:num_seen]
        count = stats.count[:num_seen]
        reasons: dict[int, tuple[str, str]] = {}
        if self.nan == "drop":
            for code in np.flatnonzero(rows == 0):
                reasons[int(code)] = ("no rows left", "every row has a NaN, inf or null value")
        if self.nan == "ffill":
            empty = count == 0
            for code in np.flatnonzero(empty.any(axis=1)):
                column = self.value_names[int(np.argmax(empty[code]))]
                reasons[int(code)] = (
                    "nothing to fill from",
                    f"column {column!r} has no finite value to fill from",
                )
        for code in np.flatnonzero((rows < self.min_length) & (rows > 0)):
            reasons.setdefault(
                int(code),
                ("too short", f"{rows[code]} rows, fewer than --min-length {self.min_length}"),
            )
        kept = np.ones(num_seen, bool)
        kept[list(reasons)] = False
        if not kept.any():
            kinds = Counter(kind for kind, _ in reasons.values())
            parts = []
            if kinds["too short"]:
                parts.append(
                    f"{kinds['too short']} entities are shorter than --min-length "
                    f"{self.min_length} (the longest has {int(rows.max())} rows)"
                )
            if kinds["no rows left"]:
                parts.append(f"{kinds['no rows left']} entities have only NaN/inf/null rows")
            if kinds["nothing to fill from"]:
                parts.append(
                    f"{kinds['nothing to fill from']} entities have a column without any "
                    "finite value"
                )
            empty = [
                n for n, ok in zip(self.value_names, self._finite_somewhere, strict=True) if not ok
            ]
            if empty:
                names = [str(f.path) for f in self.files]
                shown = ", ".join(names[:3]) + (
                    f" and {len(names) - 3} more" if len(names) > 3 else ""
                )
                what = f"column {empty[0]!r} has" if len(empty) == 1 else f"columns {empty} have"
                parts.append(f"{what} no finite value in any row of {shown}")
            raise ValueError("no entity left to store: " + "; ".join(parts))
        kept_codes = np.flatnonzero(kept)
        sort_keys = np.asarray([keys[c] for c in kept_codes])
        order = kept_codes[np.argsort(sort_keys, kind="stable")]
        self.order = order
        self.new_index = np.full(num_seen, -1, np.int64)
        self.new_index[order] = np.arange(len(order))
        self.lengths = rows[order].copy()
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.num_rows = int(self.lengths.sum())
        self.entity_count = count[order].copy()
        self.entity_mean = stats.mean[order].copy()
        self.entity_m2 = stats.m2[order].copy()
        self.entity_std = scale_of(self.entity_count, self.entity_m2)
        # entities with a NaN/inf/null value somewhere (only those need filling)
        self.has_gaps = (self.entity_count < self.lengths[:, None]).any(axis=1)
        total = self.entity_count.sum(axis=0)
        weights = np.divide(
            self.entity_count, total, out=np.zeros_like(self.entity_count), where=total > 0
        )
        mean = (weights * self.entity_mean).sum(axis=0)
        spread = self.entity_count * (self.entity_mean - mean) ** 2
        self.global_count, self.global_mean = total, mean
        self.global_m2 = self.entity_m2.sum(axis=0) + spread.sum(axis=0)
        self.global_std = scale_of(self.global_count, self.global_m2)
        self.dropped = sorted(((keys[c], r) for c, r in reasons.items()), key=lambda p: str(p[0]))
        self.entity_ids = [str(keys[c]) for c in order]
        self.category_of: dict[str, np.ndarray] = {}
        for role in ("stratum", "label"):
            codes = getattr(stats, role)[order]
            names = self.category_names[role].keys()
            self.category_of[role] = (
                np.asarray(names, dtype=object)[codes] if names else np.full(len(order), "", object)
            )
        first_time, last_time = stats.first_time[order], stats.last_time[order]
        gaps = np.maximum(self.lengths - 1, 1)
        with np.errstate(over="ignore"):
            span = last_time - first_time
        step = np.where(self.lengths > 1, span // gaps, 1)
        self.regular = (self.lengths == 1) | ((span > 0) & (span % gaps == 0))
        self.regular &= step > 0
        self.first_time = first_time
        self.step = np.where(self.regular, step, 1)

    # ---- pass 2 -------------------------------------------------------------------------
    def write(self, temp: Path, bar: Bar) -> None:
        began = time.perf_counter()
        sources.check_unchanged(self.files)
        while True:
            try:
                self._write_all(temp, bar)
                break
            except _Demoted as demoted:  # rare: redo the pass with those entities sorted
                self.regular[demoted.entities] = False
                for name in (VALUES_FILE, TIMES_FILE):
                    (temp / name).unlink()
        self.timings["write_s"] = time.perf_counter() - began

    def _write_all(self, temp: Path, bar: Bar) -> None:
        num_columns = len(self.value_names)
        columns = self.columns
        cursor = np.zeros(len(self.order), np.int64)
        self._misfits: list[np.ndarray] = []
        task = bar.add("write", self.num_rows_read)
        with (
            MappedFile(temp / VALUES_FILE, VALUES_DTYPE, (self.num_rows, num_columns)) as values,
            MappedFile(temp / TIMES_FILE, TIMES_DTYPE, (self.num_rows,)) as times,
        ):
            # Slots of placed series that received a row; their times are written in pass 3.
            self.filled = np.zeros(self.num_rows, bool)
            batches = self._batches([columns.entity, columns.time, *self.value_names])
            for number, (file, _, batch) in enumerate(batches):
                self._write_batch(file, batch, number, cursor, values, times)
                bar.advance(task, batch.num_rows)
            if self._misfits:
                raise _Demoted(np.unique(np.concatenate(self._misfits)))
            irregular = ~self.regular
            if not np.array_equal(cursor[irregular], self.lengths[irregular]):
                raise ValueError("the input files changed while they were being ingested")

    def _write_batch(
        self,
        file: sources.SourceFile,
        batch: pa.RecordBatch,
        number: int,
        cursor: np.ndarray,
        values_file: MappedFile,
        times_file: MappedFile,
    ) -> None:
        local, mapping = self._entity_codes(batch, number)
        if (mapping < 0).any():
            raise ValueError(f"{file.path} changed while it was being ingested")
        entity = self.new_index[mapping]  # [U] store index, -1 if dropped
        times = sources.to_int64_time(batch.column(self.columns.time))
        values = sources.float_columns(batch, self.value_names)
        keep = (entity >= 0)[local] if (entity < 0).any() else None
        if self.nan == "drop":
            masks = self._nonfinite(values)
            if masks:
                finite = np.logical_and.reduce(list(masks.values()))
                keep = finite if keep is None else keep & finite
        if keep is not None:
            local, times, values = local[keep], times[keep], [x[keep] for x in values]
        if local.size == 0:
            return
        entity = np.maximum(entity, 0)
        scaled = np.empty((local.size, len(values)), VALUES_DTYPE)
        for j, column in enumerate(values):
            if self.scaling == "global":
                scaled[:, j] = (column - self.global_mean[j]) / self.global_std[j]
            elif self.scaling == "per-entity":
                mean = self.entity_mean[entity, j]
                std = self.entity_std[entity, j]
                scaled[:, j] = (column - mean[local]) / std[local]
            else:
                scaled[:, j] = column
        destination, placed = self._destinations(local, entity, times, cursor)
        # whole rows as single opaque items: one copy per row instead of one per value
        row_type = np.dtype((np.void, scaled.shape[1] * scaled.itemsize))
        values_file.array.view(row_type).reshape(-1)[destination] = scaled.view(row_type).reshape(
            -1
        )
        lowest, highest = int(destination.min()), int(destination.max()) + 1
        values_file.touched(lowest, highest, destination.size)
        if placed is None:
            self.filled[destination] = True
        else:
            self.filled[destination[placed]] = True
            sorted_later = destination[~placed]
            times_file.array[sorted_later] = times[~placed]
            times_file.touched(
                int(sorted_later.min()), int(sorted_later.max()) + 1, sorted_later.size
            )

    def _entity_codes(self, batch: pa.RecordBatch, number: int) -> tuple[np.ndarray, np.ndarray]:
        """`([N] batch-local entity codes, [U] registry code of each)` of pass 2's batch
        `number`: pass 1's codes for the same batch where its dictionary is the same
        size, else found by hashing the ids again."""
        column = batch.column(self.columns.entity)
        if number < len(self._batch_maps):
            num_rows, mapping = self._batch_maps[number]
            if (
                mapping is not None
                and num_rows == batch.num_rows
                and pa.types.is_dictionary(column.type)
                and len(column.dictionary) == len(mapping)
            ):
                return to_numpy(column.indices).astype(np.int64), mapping
        return self.entities.encode(column, add=False)

    def _destinations(
        self, local: np.ndarray, entity: np.ndarray, times: np.ndarray, cursor: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """`[N]` row of `values.bin` for each row of a batch (see the module docstring),
        and which rows went to their final slot (None: all of them)."""
        regular = self.regular[entity]
        start = self.starts[entity]
        step = self.step[entity]
        if regular.all() and (step == 1).all():
            return (start - self.first_time[entity])[local] + times, None
        destination = np.empty(local.size, np.int64)
        placed = regular[local]
        if regular.any():
            rows = np.flatnonzero(placed) if not placed.all() else slice(None)
            row_local = local[rows]
            offset, remainder = np.divmod(
                times[rows] - self.first_time[entity][row_local], step[row_local]
            )
            destination[rows] = start[row_local] + offset
            misfit = remainder != 0
            if misfit.any():  # not a progression after all: this pass is redone
                self._misfits.append(np.unique(entity[row_local[misfit]]))
                destination[np.arange(local.size)[rows][misfit]] = start[row_local[misfit]]
        if not placed.all():
            rows = np.flatnonzero(~placed)
            order = np.argsort(local[rows], kind="stable")
            rows = rows[order]
            group = entity[local[rows]]
            group_starts = np.flatnonzero(np.diff(group, prepend=-1))
            group_sizes = np.diff(group_starts, append=group.size)
            rank = np.arange(group.size) - np.repeat(group_starts, group_sizes)
            destination[rows] = self.starts[group] + cursor[group] + rank
            cursor[group[group_starts]] += group_sizes
            if (cursor[group] > self.lengths[group]).any():
                raise ValueError("the input files changed while they were being ingested")
        return destination, (None if placed.all() else placed)

    # ---- pass 3 -------------------------------------------------------------------------
    def chunks(self) -> list[tuple[int, int]]:
        """Entity ranges `[a, b)` of about `chunk_rows` rows each (whole entities)."""
        chunk_rows = max(self.batch_size * 4, 1 << 18)
        ends = self.starts + self.lengths
        chunks, first = [], 0
        while first < len(ends):
            last = int(np.searchsorted(ends, self.starts[first] + chunk_rows, side="right"))
            last = max(last, first + 1)
            chunks.append((first, last))
            first = last
        return chunks

    def order_rows(self, temp: Path, bar: Bar) -> None:
        """Pass 3: checks placed entities, sorts the others, fills, checksums.

        Reads and writes with pread/pwrite in chunks of whole entities: sequential, no
        page faults, memory bounded by the chunk size. Writing back and checksumming a
        chunk (both release the GIL) run in a helper thread while the next chunk is read
        and checked; one thread keeps the checksums in file order."""
        began = time.perf_counter()
        sources.check_unchanged(self.files)
        num_columns = len(self.value_names)
        values_sum, times_sum = Checksum(), Checksum()
        task = bar.add("order", self.num_rows)

        def finish_chunk(vf, tf, row_a, row_b, values, times, write_values, write_times):
            if write_values:
                vf.write(row_a, values)
            if write_times:
                tf.write(row_a, times)
            vf.start_writeback(row_a, row_b)
            tf.start_writeback(row_a, row_b)
            values_sum.update(values)
            times_sum.update(times)

        with (
            _RawFile(temp / VALUES_FILE, num_columns * VALUES_DTYPE.itemsize) as vf,
            _RawFile(temp / TIMES_FILE, TIMES_DTYPE.itemsize) as tf,
            ThreadPoolExecutor(1, thread_name_prefix="metadist-store-writer") as writer,
        ):
            pending: deque[Future] = deque()
            for first, last in self.chunks():
                row_a = int(self.starts[first])
                row_b = int(self.starts[last - 1] + self.lengths[last - 1])
                lengths = self.lengths[first:last]
                starts = self.starts[first:last] - row_a
                regular = self.regular[first:last]
                if regular.all():
                    times = np.empty(row_b - row_a, TIMES_DTYPE)
                else:
                    times = tf.read(row_a, row_b, TIMES_DTYPE)
                values = vf.read(row_a, row_b, VALUES_DTYPE).reshape(-1, num_columns)
                changed = False
                if regular.any():
                    self._place_times(
                        first, times, self.filled[row_a:row_b], starts, lengths, regular
                    )
                if not regular.all():
                    changed = self._sort_irregular(first, times, values, lengths, regular)
                if self.nan == "ffill" and self.has_gaps[first:last].any():
                    changed |= self._fill_chunk(values, starts, lengths, self.has_gaps[first:last])
                pending.append(
                    writer.submit(
                        finish_chunk,
                        vf,
                        tf,
                        row_a,
                        row_b,
                        values,
                        times,
                        changed,
                        bool(regular.any()) or changed,
                    )  # fmt: skip
                )
                while len(pending) > 2:  # bounds the chunks held in memory
                    pending.popleft().result()
                bar.advance(task, row_b - row_a)
            while pending:
                pending.popleft().result()
        self.checksums = {VALUES_FILE: values_sum.hexdigest(), TIMES_FILE: times_sum.hexdigest()}
        self.timings["order_s"] = time.perf_counter() - began

    @staticmethod
    def _fill_chunk(
        values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, gaps: np.ndarray
    ) -> bool:
        """Forward-fills the entities of a chunk that pass 1 found non-finite values in
        (`gaps` `[E]`); the others are left unread. Few such entities: one at a time."""
        chosen = np.flatnonzero(gaps)
        if chosen.size > 64:
            return _fill_forward(values, starts, lengths)
        changed = False
        for e in chosen:
            rows = values[starts[e] : starts[e] + lengths[e]]
            changed |= _fill_forward(rows, np.zeros(1, np.int64), lengths[e : e + 1])
        return changed

    def _place_times(
        self,
        first: int,
        times: np.ndarray,
        filled: np.ndarray,
        starts: np.ndarray,
        lengths: np.ndarray,
        regular: np.ndarray,
    ) -> None:
        """Writes `first_time + k * step` into the slots of the chunk's placed entities,
        after checking that pass 2 filled every one of them: a slot left empty means two
        rows had the same time (the row count matched a progression, the rows did not)."""
        last = first + len(lengths)
        rows = None if regular.all() else np.repeat(regular, lengths)
        empty = ~filled if rows is None else ~filled & rows
        if empty.any():
            row = int(np.argmax(empty))
            self._raise_duplicate(first + int(np.searchsorted(starts, row, side="right")) - 1)
        within = np.arange(times.size) - np.repeat(starts, lengths)
        expected = np.repeat(self.first_time[first:last], lengths)
        step = self.step[first:last]
        if (step == 1).all():
            expected += within
        else:
            expected += within * np.repeat(step, lengths)
        if rows is None:
            times[:] = expected
        else:
            times[rows] = expected[rows]

    def _sort_irregular(
        self,
        first: int,
        times: np.ndarray,
        values: np.ndarray,
        lengths: np.ndarray,
        regular: np.ndarray,
    ) -> bool:
        """Sorts the rows of the chunk's irregular entities by time, in place in `times`
        and `values`; returns whether anything moved."""
        rows = np.flatnonzero(np.repeat(~regular, lengths))
        entity = np.repeat(np.arange(first, first + len(lengths))[~regular], lengths[~regular])
        row_times = times[rows]
        same = entity[1:] == entity[:-1]
        moved = bool((same & (row_times[1:] < row_times[:-1])).any())
        if moved:
            by_time = rows[np.lexsort((row_times, entity))]
            values[rows] = values[by_time]
            times[rows] = times[by_time]
            row_times = times[rows]
        repeated = np.flatnonzero(same & (row_times[1:] == row_times[:-1]))
        if repeated.size:
            self._raise_duplicate(int(entity[repeated[0]]))
        return moved

    def _raise_duplicate(self, entity: int) -> None:
        """Raises the error for a duplicate time of store entity `entity`, naming the
        time and the two source rows (found by reading that entity's rows again)."""
        key = self.entities.keys()[self.order[entity]]
        found = self._source_rows(key)
        times = np.asarray([t for t, _, _ in found], np.int64)
        unique, counts = np.unique(times, return_counts=True)
        if not (counts > 1).any():
            raise ValueError("the input files changed while they were being ingested")
        when = unique[np.argmax(counts > 1)]
        places = [(path, row) for t, path, row in found if t == when][:2]
        where = " and ".join(f"{path} row {row}" for path, row in places)
        raise ValueError(
            f"duplicate (entity, time): entity {key!r} has more than one row at "
            f"{self.columns.time} = {_format_time(int(when), self.time_kind)} ({where})"
        )

    def _source_rows(self, key: Any) -> list[tuple[int, Path, int]]:
        """(time, file, row) of every stored row of entity `key` in the input."""
        columns = self.columns
        found: list[tuple[int, Path, int]] = []
        for file in self.files:
            for offset, batch in sources.iter_batches(
                file, [columns.entity, columns.time, *self.value_names], self.batch_size, ()
            ):
                entity = batch.column(columns.entity)
                match = pc.equal(entity, pa.scalar(key, entity.type))
                hit = to_numpy(match).astype(bool)
                if self.nan == "drop" and hit.any():
                    for column in sources.float_columns(batch, self.value_names):
                        hit &= np.isfinite(column)
                times = sources.to_int64_time(batch.column(columns.time))
                found += [(int(times[r]), file.path, offset + int(r)) for r in np.flatnonzero(hit)]
        return found

    # ---- index and metadata ---------------------------------------------------------------
    def finish(self, temp: Path, src: str | Path) -> None:
        index = pa.table(
            {
                "entity_id": string_array(self.entity_ids),
                "start": int64_array(self.starts),
                "length": int64_array(self.lengths),
                "stratum": string_array(self.category_of["stratum"].tolist()),
                "label": string_array(self.category_of["label"].tolist()),
            }
        )
        with (
            pa.OSFile(str(temp / INDEX_FILE), "wb") as sink,
            pa.ipc.new_file(sink, index.schema) as writer,
        ):
            writer.write_table(index)
        fsync_path(temp / INDEX_FILE)
        with open(temp / ENTITY_STATS_FILE, "wb") as handle:
            np.savez(
                handle,
                count=self.entity_count.astype(np.int64),
                mean=self.entity_mean,
                m2=self.entity_m2,
                std=self.entity_std,
            )
            handle.flush()
            os.fsync(handle.fileno())
        write_json(temp / METADATA_FILE, self.metadata(src))
        fsync_path(temp)

    def metadata(self, src: str | Path) -> dict[str, Any]:
        columns = self.columns
        strata: dict[str, dict[str, int]] = {}
        for name, length in zip(self.category_of["stratum"], self.lengths, strict=True):
            entry = strata.setdefault(str(name), {"entities": 0, "rows": 0})
            entry["entities"] += 1
            entry["rows"] += int(length)
        reasons = Counter(kind for _, (kind, _) in self.dropped)
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "feature_names": list(columns.features),
            "target_names": list(columns.targets),
            "column_names": self.value_names,
            "entity_col": columns.entity,
            "time_col": columns.time,
            "time_kind": self.time_kind,
            "stratum_col": columns.stratum,
            "label_col": columns.label,
            "num_entities": len(self.order),
            "num_rows": self.num_rows,
            "nan_policy": self.nan,
            "min_length": self.min_length,
            "scaling": {
                "kind": self.scaling,
                "count": self.global_count.astype(np.int64).tolist(),
                "mean": self.global_mean.tolist(),
                "m2": self.global_m2.tolist(),
                "std": self.global_std.tolist(),
                "entity_stats": ENTITY_STATS_FILE,
            },
            "source": {
                "path": str(src),
                "fingerprint": sources.fingerprint(self.files),
                "num_files": len(self.files),
                "num_rows_read": self.num_rows_read,
            },
            "checksum_algorithm": CHECKSUM_ALGORITHM,
            "checksums": self.checksums,
            "strata": strata,
            "dropped": {
                "num_entities": len(self.dropped),
                "reasons": dict(reasons),
                "entities": [
                    {"entity_id": str(key), "reason": reason}
                    for key, (_, reason) in self.dropped[:_MAX_DROPPED_LISTED]
                ],
            },
            "timings_s": {key: round(value, 3) for key, value in self.timings.items()},
        }


def _fill_forward(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Forward-fills non-finite values in place, within each entity of a chunk; values
    before an entity's first finite one take that first finite value. Works on the
    runs of non-finite values only, so its cost follows the number of gaps.

    Args:
        values: `[N, C]` rows of whole entities, time-sorted.
        starts, lengths: `[E]` entity row ranges within `values`; every entity has a
            finite value in every column.

    Returns:
        Whether anything was filled.
    """
    finite = np.isfinite(values)
    if finite.all():
        return False
    for j in np.flatnonzero(~finite.all(axis=0)):
        rows = np.flatnonzero(~finite[:, j])
        entity = np.searchsorted(starts, rows, side="right") - 1
        new_run = np.ones(rows.size, bool)
        new_run[1:] = (rows[1:] != rows[:-1] + 1) | (entity[1:] != entity[:-1])
        run_first = rows[new_run]
        run_last = rows[np.append(np.flatnonzero(new_run)[1:] - 1, rows.size - 1)]
        run_entity = entity[new_run]
        source = np.where(run_first > starts[run_entity], run_first - 1, run_last + 1)
        values[rows, j] = values[np.repeat(source, run_last - run_first + 1), j]
    return True


class _RawFile:
    """Positional reads and writes of whole rows of a store file."""

    def __init__(self, path: Path, row_bytes: int) -> None:
        self.fd = os.open(path, os.O_RDWR)
        self.row_bytes = row_bytes

    def read(self, first_row: int, end_row: int, dtype: np.dtype) -> np.ndarray:
        out = np.empty((end_row - first_row) * self.row_bytes, np.uint8)
        view, offset = memoryview(out), first_row * self.row_bytes
        done = 0
        while done < out.size:
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"short read from a store file at byte {offset + done}")
            done += got
        return out.view(dtype)

    def start_writeback(self, first_row: int, end_row: int) -> None:
        """Lets the kernel start writing these rows to disk now (see `start_writeback`)."""
        offset = first_row * self.row_bytes
        start_writeback(self.fd, offset, (end_row - first_row) * self.row_bytes)

    def write(self, first_row: int, rows: np.ndarray) -> None:
        view, offset = memoryview(np.ascontiguousarray(rows)).cast("B"), first_row * self.row_bytes
        done = 0
        while done < len(view):
            done += os.pwritev(self.fd, [view[done:]], offset + done)

    def __enter__(self) -> _RawFile:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        try:
            if exc_type is None:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)


def _format_time(value: int, kind: str) -> str:
    if kind == "timestamp":
        return str(np.datetime64(int(value), "ns"))
    return str(value)
