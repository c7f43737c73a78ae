"""The three passes of `metadist ingest` over the Parquet input (see `ingest.py`)."""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metadist.store import sources
from metadist.store.files import PAGE_BYTES, MappedFile
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
    fsync_path,
    new_hasher,
    write_json,
)
from metadist.store.progress import Bar
from metadist.store.scaler import merge_moments, moments_of_groups, scale_of

_MAX_DROPPED_LISTED = 1000


class _Registry:
    """Maps keys (entity ids, stratum names) to dense codes in order of first sight."""

    def __init__(self) -> None:
        self.codes: dict[Any, int] = {}
        self._last_dictionary: pa.Array | None = None
        self._last_map: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.codes)

    def keys(self) -> list[Any]:
        return list(self.codes)

    def encode(self, column: pa.Array, *, add: bool) -> tuple[np.ndarray, np.ndarray]:
        """`([N] row codes local to the batch, [U] global code of each local code)`.

        With `add=False`, keys never seen get code -1.
        """
        if pa.types.is_dictionary(column.type):
            dictionary = column.dictionary
            local = column.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        else:
            encoded = column.dictionary_encode()
            dictionary = encoded.dictionary
            local = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        last = self._last_dictionary
        if last is not None and len(last) == len(dictionary) and last.equals(dictionary):
            return local, self._last_map
        keys = dictionary.to_pylist()
        if add:
            codes = self.codes
            mapping = np.fromiter(
                (codes.setdefault(key, len(codes)) for key in keys), np.int64, len(keys)
            )
        else:
            get = self.codes.get
            mapping = np.fromiter((get(key, -1) for key in keys), np.int64, len(keys))
        if len(np.unique(mapping)) != len(mapping):  # a dictionary with repeated entries
            return self.encode(column.dictionary_decode(), add=add)
        self._last_dictionary, self._last_map = dictionary, mapping
        return local, mapping


class _Growing:
    """Per-entity arrays that grow as new entities appear."""

    def __init__(self, num_columns: int) -> None:
        self.capacity = 1024
        self.rows = np.zeros(self.capacity, np.int64)
        self.count = np.zeros((self.capacity, num_columns))
        self.mean = np.zeros((self.capacity, num_columns))
        self.m2 = np.zeros((self.capacity, num_columns))
        self.stratum = np.full(self.capacity, -1, np.int64)
        self.label = np.full(self.capacity, -1, np.int64)

    def reserve(self, size: int) -> None:
        if size <= self.capacity:
            return
        capacity = max(size, 2 * self.capacity)
        for name in ("rows", "count", "mean", "m2", "stratum", "label"):
            old = getattr(self, name)
            fill = -1 if name in ("stratum", "label") else 0
            new = np.full((capacity,) + old.shape[1:], fill, old.dtype)
            new[: self.capacity] = old
            setattr(self, name, new)
        self.capacity = capacity


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
        entity_type = schema.field(columns.entity).type
        self.entity_is_int = pa.types.is_integer(
            entity_type.value_type if pa.types.is_dictionary(entity_type) else entity_type
        )
        self.dictionary_columns = [] if self.entity_is_int else [columns.entity]
        self.entities = _Registry()
        self.category_names: dict[str, _Registry] = {"stratum": _Registry(), "label": _Registry()}
        self.stats = _Growing(len(self.value_names))
        self.num_rows_read = sum(f.num_rows for f in files)
        self.timings: dict[str, float] = {}

    # ---- pass 1 -------------------------------------------------------------------------
    def scan(self, bar: Bar) -> None:
        began = time.perf_counter()
        columns = self.columns
        read = [columns.entity, *self.value_names]
        read += [c for c in (columns.stratum, columns.label) if c is not None and c not in read]
        task = bar.add("scan", self.num_rows_read)
        for file in self.files:
            for offset, batch in sources.iter_batches(
                file, read, self.batch_size, self.dictionary_columns
            ):
                self._scan_batch(file, offset, batch)
                bar.advance(task, batch.num_rows)
        self.timings["scan_s"] = time.perf_counter() - began

    def _scan_batch(self, file: sources.SourceFile, offset: int, batch: pa.RecordBatch) -> None:
        columns = self.columns
        entity_column = batch.column(columns.entity)
        self._reject_nulls(file, offset, entity_column, columns.entity)
        local, mapping = self.entities.encode(entity_column, add=True)
        stats = self.stats
        stats.reserve(len(self.entities))
        row_codes = mapping[local]
        for role, name in (("stratum", columns.stratum), ("label", columns.label)):
            if name is not None:
                self._check_constant(file, offset, batch, role, name, row_codes)
        values = sources.to_float64(batch, self.value_names)
        finite = np.isfinite(values)
        if not finite.all():
            if self.nan == "error":
                row, col = np.argwhere(~finite)[0]
                entity = self.entities.keys()[row_codes[row]]
                name = self.value_names[col]
                shown = "null" if not batch.column(name)[int(row)].is_valid else values[row, col]
                raise ValueError(
                    f"{file.path}: row {offset + row}: column {name!r} of entity {entity!r} "
                    f"is {shown} (NaN, inf or null is an error under --nan error; use --nan "
                    "ffill or --nan drop)"
                )
            if self.nan == "drop":
                keep = finite.all(axis=1)
                local, values = local[keep], values[keep]
        num_local = len(mapping)
        stats.rows[mapping] += np.bincount(local, minlength=num_local)
        count, mean, m2 = moments_of_groups(local, values, num_local)
        stats.count[mapping], stats.mean[mapping], stats.m2[mapping] = merge_moments(
            stats.count[mapping], stats.mean[mapping], stats.m2[mapping], count, mean, m2
        )

    def _reject_nulls(
        self, file: sources.SourceFile, offset: int, column: pa.Array, name: str
    ) -> None:
        position = sources.first_null(column)
        if position is not None:
            raise ValueError(f"{file.path}: row {offset + position}: column {name!r} is null")

    def _check_constant(
        self,
        file: sources.SourceFile,
        offset: int,
        batch: pa.RecordBatch,
        role: str,
        name: str,
        row_codes: np.ndarray,
    ) -> None:
        column = batch.column(name)
        self._reject_nulls(file, offset, column, name)
        registry = self.category_names[role]
        local, mapping = registry.encode(pc.cast(column, pa.string()), add=True)
        row_values = mapping[local]
        first = getattr(self.stats, role)
        unset = first[row_codes] < 0
        if unset.any():
            codes, where = np.unique(row_codes[unset], return_index=True)
            first[codes] = row_values[np.flatnonzero(unset)[where]]
        bad = np.flatnonzero(first[row_codes] != row_values)
        if bad.size:
            row = bad[0]
            names = registry.keys()
            entity = self.entities.keys()[row_codes[row]]
            raise ValueError(
                f"{file.path}: row {offset + row}: {role} column {name!r} is not constant "
                f"within entity {entity!r}: {names[row_values[row]]!r} here, "
                f"{names[first[row_codes[row]]]!r} on an earlier row"
            )

    # ---- between the passes -------------------------------------------------------------
    def plan(self) -> None:
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
            raise ValueError("no entity left to store: " + "; ".join(parts))
        kept_codes = np.flatnonzero(kept)
        sort_keys = np.asarray([keys[c] for c in kept_codes])
        order = kept_codes[np.argsort(sort_keys, kind="stable")]
        self.entity_codes = order
        self.new_index = np.full(num_seen, -1, np.int64)
        self.new_index[order] = np.arange(len(order))
        self.lengths = rows[order].copy()
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.num_rows = int(self.lengths.sum())
        self.entity_count = count[order].copy()
        self.entity_mean = stats.mean[order].copy()
        self.entity_m2 = stats.m2[order].copy()
        self.entity_std = scale_of(self.entity_count, self.entity_m2)
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

    def _scale(self, values: np.ndarray, entity: np.ndarray) -> np.ndarray:
        if self.scaling == "global":
            return (values - self.global_mean) / self.global_std
        if self.scaling == "per-entity":
            return (values - self.entity_mean[entity]) / self.entity_std[entity]
        return values

    # ---- pass 2 -------------------------------------------------------------------------
    def write(self, temp: Path, bar: Bar) -> None:
        began = time.perf_counter()
        num_columns = len(self.value_names)
        columns = self.columns
        read = [columns.entity, columns.time, *self.value_names]
        cursor = np.zeros(len(self.entity_codes), np.int64)
        task = bar.add("write", self.num_rows_read)
        with (
            MappedFile(temp / VALUES_FILE, VALUES_DTYPE, (self.num_rows, num_columns)) as values,
            MappedFile(temp / TIMES_FILE, TIMES_DTYPE, (self.num_rows,)) as times,
        ):
            for file in self.files:
                for offset, batch in sources.iter_batches(
                    file, read, self.batch_size, self.dictionary_columns
                ):
                    self._write_batch(file, offset, batch, cursor, values, times)
                    bar.advance(task, batch.num_rows)
            if not np.array_equal(cursor, self.lengths):
                raise ValueError("the input files changed while they were being ingested")
        self.timings["write_s"] = time.perf_counter() - began

    def _write_batch(
        self,
        file: sources.SourceFile,
        offset: int,
        batch: pa.RecordBatch,
        cursor: np.ndarray,
        values_file: MappedFile,
        times_file: MappedFile,
    ) -> None:
        local, mapping = self.entities.encode(batch.column(self.columns.entity), add=False)
        if (mapping < 0).any():
            raise ValueError(f"{file.path} changed while it was being ingested")
        entity = self.new_index[mapping][local]
        time_column = batch.column(self.columns.time)
        self._reject_nulls(file, offset, time_column, self.columns.time)
        times = sources.to_int64_time(time_column)
        values = sources.to_float64(batch, self.value_names)
        keep = entity >= 0
        if self.nan == "drop":
            keep &= np.isfinite(values).all(axis=1)
        if not keep.all():
            entity, times, values = entity[keep], times[keep], values[keep]
        if entity.size == 0:
            return
        scaled = self._scale(values, entity).astype(VALUES_DTYPE)
        order = np.argsort(entity, kind="stable")
        entity = entity[order]
        group_starts = np.flatnonzero(np.diff(entity, prepend=-1))
        group_sizes = np.diff(group_starts, append=entity.size)
        groups = entity[group_starts]
        rank = np.arange(entity.size) - np.repeat(group_starts, group_sizes)
        destination = self.starts[entity] + cursor[entity] + rank
        cursor[groups] += group_sizes
        if (cursor[groups] > self.lengths[groups]).any():
            raise ValueError(f"{file.path} changed while it was being ingested")
        values_file.array[destination] = scaled[order]
        times_file.array[destination] = times[order]
        row_bytes = values_file.array.strides[0]
        touched = groups.size * PAGE_BYTES + entity.size * row_bytes
        values_file.touched(touched)
        times_file.touched(groups.size * PAGE_BYTES + entity.size * 8)

    # ---- pass 3 -------------------------------------------------------------------------
    def order_chunks(self) -> list[tuple[int, int]]:
        """Entity ranges `[a, b)` of roughly `chunk_rows` rows each (whole entities)."""
        chunk_rows = max(self.batch_size * 16, 1 << 20)
        ends = self.starts + self.lengths
        chunks, first = [], 0
        while first < len(ends):
            last = int(np.searchsorted(ends, self.starts[first] + chunk_rows, side="right"))
            last = max(last, first + 1)
            chunks.append((first, last))
            first = last
        return chunks

    def order(self, temp: Path, bar: Bar) -> None:
        began = time.perf_counter()
        num_columns = len(self.value_names)
        values_hash, times_hash = new_hasher(), new_hasher()
        task = bar.add("order", self.num_rows)
        with (
            MappedFile(temp / VALUES_FILE, VALUES_DTYPE, (self.num_rows, num_columns), True) as vf,
            MappedFile(temp / TIMES_FILE, TIMES_DTYPE, (self.num_rows,), True) as tf,
        ):
            for first, last in self.order_chunks():
                row_a, row_b = (
                    int(self.starts[first]),
                    int(self.starts[last - 1] + self.lengths[last - 1]),
                )
                times = np.array(tf.array[row_a:row_b])
                values = np.array(vf.array[row_a:row_b])
                entity = np.repeat(np.arange(first, last), self.lengths[first:last])
                same = entity[1:] == entity[:-1]
                changed = False
                if (same & (times[1:] < times[:-1])).any():
                    by_time = np.lexsort((times, entity))
                    times, values = times[by_time], values[by_time]
                    changed = True
                duplicate = np.flatnonzero(same & (times[1:] == times[:-1]))
                if duplicate.size:
                    self._raise_duplicate(int(entity[duplicate[0]]), int(times[duplicate[0]]))
                if self.nan == "ffill" and not np.isfinite(values).all():
                    starts = self.starts[first:last] - row_a
                    values = _fill_forward(values, starts, self.lengths[first:last])
                    changed = True
                if changed:
                    tf.array[row_a:row_b] = times
                    vf.array[row_a:row_b] = values
                values_hash.update(values.data)
                times_hash.update(times.data)
                vf.touched(values.nbytes)
                tf.touched(times.nbytes)
                bar.advance(task, row_b - row_a)
        self.checksums = {
            VALUES_FILE: values_hash.hexdigest(),
            TIMES_FILE: times_hash.hexdigest(),
        }
        self.timings["order_s"] = time.perf_counter() - began

    def _raise_duplicate(self, entity: int, when: int) -> None:
        key = self.entities.keys()[self.entity_codes[entity]]
        shown = _format_time(when, self.time_kind)
        places = _locate_rows(self.files, self.columns, key, when)
        where = " and ".join(f"{path} row {row}" for path, row in places)
        raise ValueError(
            f"duplicate (entity, time): entity {key!r} has more than one row at "
            f"{self.columns.time} = {shown}" + (f" ({where})" if where else "")
        )

    # ---- index and metadata ---------------------------------------------------------------
    def finish(self, temp: Path, src: str | Path) -> None:
        index = pa.table(
            {
                "entity_id": pa.array(self.entity_ids, pa.string()),
                "start": pa.array(self.starts, pa.int64()),
                "length": pa.array(self.lengths, pa.int64()),
                "stratum": pa.array(self.category_of["stratum"].tolist(), pa.string()),
                "label": pa.array(self.category_of["label"].tolist(), pa.string()),
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
            "num_entities": len(self.entity_codes),
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


def _fill_forward(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Forward-fills non-finite values within each entity of a chunk; values before an
    entity's first finite one take that first finite value.

    Args:
        values: `[N, C]` rows of whole entities, time-sorted.
        starts, lengths: `[E]` entity row ranges within `values`; every entity has a
            finite value in every column.
    """
    num_rows = values.shape[0]
    position = np.arange(num_rows)[:, None]
    finite = np.isfinite(values)
    source = np.where(finite, position, -1)
    source[starts] = np.maximum(source[starts], starts[:, None])
    source = np.maximum.accumulate(source, axis=0)
    later = np.where(finite, position, num_rows)
    ends = starts + lengths - 1
    later[ends] = np.minimum(later[ends], ends[:, None])
    later = np.minimum.accumulate(later[::-1], axis=0)[::-1]
    columns = np.arange(values.shape[1])
    filled = values[source, columns]
    return np.where(np.isfinite(filled), filled, values[later, columns])


def _format_time(value: int, kind: str) -> str:
    if kind == "timestamp":
        return str(np.datetime64(int(value), "ns"))
    return str(value)


def _locate_rows(
    files: list[sources.SourceFile], columns: sources.Columns, key: Any, when: int
) -> list[tuple[Path, int]]:
    """Up to two (file, row) places of entity `key` at time `when` (for error messages)."""
    places: list[tuple[Path, int]] = []
    for file in files:
        for offset, batch in sources.iter_batches(
            file, [columns.entity, columns.time], 1 << 16, ()
        ):
            entity = batch.column(columns.entity)
            if pa.types.is_dictionary(entity.type):
                entity = entity.dictionary_decode()
            match = pc.equal(entity, pa.scalar(key, entity.type))
            hits = np.flatnonzero(
                match.to_numpy(zero_copy_only=False)
                & (sources.to_int64_time(batch.column(columns.time)) == when)
            )
            places += [(file.path, offset + int(row)) for row in hits]
            if len(places) >= 2:
                return places[:2]
    return places
