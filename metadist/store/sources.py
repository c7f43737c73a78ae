"""Parquet input of `metadist ingest`: finding files, checking schemas, decoding batches."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metadist.store.arrow import to_numpy
from metadist.store.parallel import thread_cache

_MAX_INTERLEAVED_FILES = 256
_READ_BUFFER_BYTES = 1 << 20  # per column being decoded, per worker
# A row group whose column chunks hold at most this many bytes (compressed) is read
# whole instead: one read per column chunk rather than a copy through the buffer (about
# a tenth of the decoding's CPU time on row groups of 32k rows), in less memory than
# the buffers of ten columns.
_WHOLE_READ_BYTES = 4 << 20


@dataclass(frozen=True)
class Columns:
    """The roles the user gave to Parquet columns."""

    entity: str
    time: str
    features: tuple[str, ...]
    targets: tuple[str, ...]
    stratum: str | None
    label: str | None

    @property
    def value_columns(self) -> tuple[str, ...]:
        """Store columns: the features, then targets that are not features."""
        return self.features + tuple(t for t in self.targets if t not in self.features)

    def roles(self) -> list[tuple[str, str]]:
        """(column, option) pairs, for error messages."""
        pairs = [(self.entity, "--entity-col"), (self.time, "--time-col")]
        pairs += [(name, "--features") for name in self.features]
        pairs += [(name, "--targets") for name in self.targets]
        if self.stratum is not None:
            pairs.append((self.stratum, "--stratum-col"))
        if self.label is not None:
            pairs.append((self.label, "--label-col"))
        return pairs


@dataclass(frozen=True)
class SourceFile:
    path: Path
    num_rows: int
    size: int
    mtime_ns: int


def open_parquet(
    path: Path,
    read_dictionary: Sequence[str] = (),
    metadata: pq.FileMetaData | None = None,
    buffer_size: int = 0,
    pre_buffer: bool | None = None,
) -> pq.ParquetFile:
    """Opens one Parquet file (with its footer `metadata` if already parsed), turning
    Arrow's errors into a message naming the file. With `buffer_size`, column chunks
    are read in pieces of that many bytes instead of whole, so memory does not follow
    the row-group size. `pre_buffer` (default: without `buffer_size`) reads all of a
    row group's chunks ahead, on Arrow's I/O threads."""
    try:
        return pq.ParquetFile(
            path,
            read_dictionary=list(read_dictionary) or None,
            metadata=metadata,
            pre_buffer=buffer_size == 0 if pre_buffer is None else pre_buffer,
            buffer_size=buffer_size,
        )
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{path} is not a readable Parquet file: {error}") from error


def _is_numeric(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype)


def _is_time(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_timestamp(dtype) or pa.types.is_date(dtype)


def _value_type(dtype: pa.DataType) -> pa.DataType:
    return dtype.value_type if pa.types.is_dictionary(dtype) else dtype


def open_sources(paths: list[Path]) -> list[tuple[SourceFile, pa.Schema]]:
    """Every file of `paths` (its footer only) with its row count, size, modification
    time and schema.

    Raises:
        ValueError: a file is not Parquet.
    """
    opened = []
    for path in paths:
        parquet = open_parquet(path)
        stat = path.stat()
        file = SourceFile(path, parquet.metadata.num_rows, stat.st_size, stat.st_mtime_ns)
        opened.append((file, parquet.schema_arrow))
    return opened


def reference_schema(opened: list[tuple[SourceFile, pa.Schema]]) -> tuple[Path, pa.Schema]:
    """The first file that holds rows, and its schema (the first file where none does):
    a file without rows may type its columns `null` (pandas writes an empty frame so)."""
    for file, schema in opened:
        if file.num_rows:
            return file.path, schema
    return opened[0][0].path, opened[0][1]


def check_sources(
    opened: list[tuple[SourceFile, pa.Schema]], columns: Columns
) -> tuple[list[SourceFile], pa.Schema]:
    """Checks the columns that `columns` names in every file that holds rows: there, of
    a type fit for their role, and, but for features and targets (any numeric type, as
    pandas writes an integer column with a missing value as floats) and times (any
    integer type; timestamps of any unit, all with a time zone, of any zone, or all
    without one, and dates), of the type they have in the first such file
    (`reference_schema`). The order of the columns, and
    columns the ingest does not read, may differ between files; files without rows add
    nothing and are not checked.

    Returns:
        The files, and the schema of the first that holds rows (a feature or target of
        several types there as float64).

    Raises:
        ValueError: a column is missing from a file, has a type unfit for its role, or
            (the entity, time, stratum or label column) another type than in the first.
    """
    first, schema = reference_schema(opened)
    values = set(columns.value_columns)
    for file, other in opened:
        if not file.num_rows and file.path != first:
            continue
        _check_roles(file.path, other, columns)
        for name, _ in columns.roles():
            kind, other_kind = schema.field(name).type, other.field(name).type
            if kind.equals(other_kind):
                continue
            if name in values:  # numbers either way: read as float64
                schema = schema.set(schema.get_field_index(name), pa.field(name, pa.float64()))
                continue
            if name == columns.time and _time_family(kind) == _time_family(other_kind):
                continue  # each batch's times become int64 (nanoseconds) on their own
            raise ValueError(
                f"schema of {file.path} differs from {first}: column {name!r} is "
                f"{other_kind} there but {kind} in {first}"
            )
    return [file for file, _ in opened], schema


def _time_family(dtype: pa.DataType) -> str:
    """`"int"`, `"instant"` (timestamps with a time zone) or `"local"` (without one, and
    dates): times of one family, whatever their width, unit or zone, compare as int64."""
    dtype = _value_type(dtype)
    if pa.types.is_integer(dtype):
        return "int"
    return "instant" if pa.types.is_timestamp(dtype) and dtype.tz is not None else "local"


def _check_roles(path: Path, schema: pa.Schema, columns: Columns) -> None:
    names = schema.names
    for name, option in columns.roles():
        if name not in names:
            raise ValueError(
                f"column {name!r} ({option}) is missing from {path}; its columns are {names}"
            )
    for name, option in [(n, "--features") for n in columns.features] + [
        (n, "--targets") for n in columns.targets
    ]:
        dtype = _value_type(schema.field(name).type)
        if not _is_numeric(dtype):
            raise ValueError(
                f"column {name!r} ({option}) in {path} has type {dtype}; features and "
                "targets must be numeric (integer, floating point or boolean)"
            )
    time_type = _value_type(schema.field(columns.time).type)
    if not _is_time(time_type):
        raise ValueError(
            f"column {columns.time!r} (--time-col) in {path} has type {time_type}; the time "
            "column must hold integers, timestamps or dates"
        )
    entity_type = _value_type(schema.field(columns.entity).type)
    if not (
        pa.types.is_string(entity_type)
        or pa.types.is_large_string(entity_type)
        or pa.types.is_integer(entity_type)
    ):
        raise ValueError(
            f"column {columns.entity!r} (--entity-col) in {path} has type {entity_type}; "
            "entity ids must be strings or integers"
        )


def check_same_schema(first: Path, schema: pa.Schema, path: Path, other: pa.Schema) -> None:
    """Raises `ValueError` naming both files where `other` (of `path`) is not `schema` (of
    `first`): the columns missing or extra, their order, or a column's type."""
    if other.names != schema.names:
        missing = [n for n in schema.names if n not in other.names]
        extra = [n for n in other.names if n not in schema.names]
        detail = []
        if missing:
            detail.append(f"it lacks {missing}")
        if extra:
            detail.append(f"it has extra columns {extra}")
        if not detail:
            detail.append(f"its column order is {other.names}, not {schema.names}")
        raise ValueError(f"schema of {path} differs from {first}: {'; '.join(detail)}")
    for field, other_field in zip(schema, other, strict=True):
        if not field.type.equals(other_field.type):
            raise ValueError(
                f"schema of {path} differs from {first}: column {field.name!r} is "
                f"{other_field.type} there but {field.type} in {first}"
            )


def fingerprint(files: list[SourceFile]) -> str:
    """Hex digest of the input files' paths, sizes and modification times."""
    hasher = hashlib.blake2b(digest_size=16)
    for file in files:
        hasher.update(f"{file.path.resolve()}\0{file.size}\0{file.mtime_ns}\n".encode())
    return hasher.hexdigest()


def check_unchanged(files: list[SourceFile]) -> None:
    """Raises ValueError if an input file changed size or modification time since it was
    first opened (the passes must all see the same data)."""
    for file in files:
        try:
            stat = file.path.stat()
        except FileNotFoundError as error:
            raise ValueError(f"{file.path} disappeared while it was being ingested") from error
        if (stat.st_size, stat.st_mtime_ns) != (file.size, file.mtime_ns):
            raise ValueError(f"{file.path} changed while it was being ingested")


def iter_batches(
    file: SourceFile, columns: list[str], batch_size: int, dictionary_columns: Sequence[str]
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Yields `(first_row_in_file, batch)` of one file, in bounded record batches.

    Raises:
        ValueError: the file cannot be read (corrupt pages, truncated file).
    """
    parquet = open_parquet(file.path, dictionary_columns)
    offset = 0
    try:
        for batch in parquet.iter_batches(batch_size=batch_size, columns=columns):
            yield offset, batch
            offset += batch.num_rows
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{file.path} is corrupt near row {offset}: {error}") from error


@dataclass(frozen=True)
class Unit:
    """One row group of one input file: the item that a worker decodes.

    `first_row` is the row group's first row within its file and `input_row` within the
    whole input (the files concatenated in order)."""

    number: int
    file: SourceFile
    row_group: int
    first_row: int
    input_row: int
    num_rows: int
    # the file's footer, parsed once and shared (read-only) by every worker
    metadata: pq.FileMetaData | None = dataclasses.field(default=None, compare=False, repr=False)
    num_bytes: int = 0  # compressed bytes of all its column chunks (0: not known)


def units(files: list[SourceFile]) -> list[Unit]:
    """The row groups of all files in reading order: row group 0 of every file, then row
    group 1 of every file, and so on.

    Writers that deal rows over several files (Spark, Dask, the synthetic panel) put
    related rows into the same row group index of each file; reading them together keeps
    the store region that a stretch of batches writes to small. With more than
    `_MAX_INTERLEAVED_FILES` files, files are read one after another instead.

    Raises:
        ValueError: a file cannot be read.
    """
    per_file: list[list[tuple[int, int, int, int]]] = []
    footers = []
    sizes: dict[tuple[int, int], int] = {}  # (file, row group) -> compressed bytes
    input_row = 0
    for k, file in enumerate(files):
        metadata = open_parquet(file.path).metadata
        footers.append(metadata)
        groups: list[tuple[int, int, int]] = []
        first = 0
        for group in range(metadata.num_row_groups):
            size = metadata.row_group(group).num_rows
            groups.append((group, first, size))
            sizes[(k, group)] = _compressed_bytes(metadata.row_group(group))
            first += size
        per_file.append([(g, f, input_row + f, n) for g, f, n in groups])
        input_row += first
    order: list[tuple[int, tuple[int, int, int, int]]] = []
    if len(files) > _MAX_INTERLEAVED_FILES:
        order = [(k, group) for k, groups in enumerate(per_file) for group in groups]
    else:
        most = max((len(groups) for groups in per_file), default=0)
        order = [
            (k, per_file[k][g])
            for g in range(most)
            for k in range(len(files))
            if g < len(per_file[k])
        ]
    return [
        Unit(number, files[k], group, first, at, size, footers[k], sizes[(k, group)])
        for number, (k, (group, first, at, size)) in enumerate(order)
        if size > 0
    ]


def _compressed_bytes(row_group: pq.RowGroupMetaData) -> int:
    return sum(row_group.column(j).total_compressed_size for j in range(row_group.num_columns))


def iter_unit(
    unit: Unit, columns: list[str], batch_size: int, dictionary_columns: Sequence[str]
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Yields `(first_row_in_file, batch)` of one row group, in bounded record batches,
    decoded in the calling thread. A worker of `ordered_streams` opens each file once
    and keeps it open for the row groups it decodes next (parsing the footer and
    resolving the path cost as much as decoding a small row group).

    Raises:
        ValueError: the file cannot be read (corrupt pages, truncated file).
    """
    cache = thread_cache()
    whole = 0 < unit.num_bytes <= _WHOLE_READ_BYTES
    key = ("parquet", unit.file.path, tuple(dictionary_columns), whole)
    parquet = cache.get(key) if cache is not None else None
    if parquet is None:
        parquet = open_parquet(
            unit.file.path,
            dictionary_columns,
            unit.metadata,
            0 if whole else _READ_BUFFER_BYTES,
            pre_buffer=False,
        )
        if cache is not None:  # a pool thread: kept open for its next row groups
            cache.put(key, parquet)
    offset = unit.first_row
    try:
        for batch in parquet.iter_batches(
            batch_size=batch_size, row_groups=[unit.row_group], columns=columns, use_threads=False
        ):
            yield offset, batch
            offset += batch.num_rows
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{unit.file.path} is corrupt near row {offset}: {error}") from error


def first_null(array: pa.Array) -> int | None:
    """Position of the first null in `array`, or None."""
    if array.null_count == 0:
        return None
    return int(np.flatnonzero(to_numpy(pc.is_null(array)))[0])


def float_columns(
    batch: pa.RecordBatch, names: Sequence[str], keep_float32: bool = False
) -> list[np.ndarray]:
    """The numeric columns `names` as `[N]` float64 arrays (zero-copy where possible;
    nulls become NaN). With `keep_float32`, float32 columns stay float32 (every float32
    is a float64 exactly, so sums that accumulate in float64 do not change)."""
    out = []
    for name in names:
        column = batch.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        if keep_float32 and pa.types.is_float32(column.type) and column.null_count:
            column = pc.fill_null(column, float("nan"))
        values = to_numpy(column)
        keep = values.dtype == np.float64 or (keep_float32 and values.dtype == np.float32)
        out.append(values if keep else values.astype(np.float64))
    return out


def raw_float32_rows(batch: pa.RecordBatch, names: Sequence[str]) -> np.ndarray | None:
    """`[N, C]` float32 rows of the columns `names` if they are all float32 (nulls as
    NaN), else None."""
    out = np.empty((batch.num_rows, len(names)), np.float32)
    for j, name in enumerate(names):
        column = batch.column(name)
        if not pa.types.is_float32(column.type):
            return None
        if column.null_count:
            column = pc.fill_null(column, float("nan"))
        out[:, j] = to_numpy(column)
    return out


def time_kind(dtype: pa.DataType) -> str:
    """`"int"` for integer time columns, `"timestamp"` for timestamps and dates."""
    return "int" if pa.types.is_integer(_value_type(dtype)) else "timestamp"


def to_int64_time(
    column: pa.Array, path: Path | None = None, offset: int = 0, name: str = ""
) -> np.ndarray:
    """`[N]` int64 times: integers as given, timestamps and dates as epoch nanoseconds.

    Args:
        column: the time column of a batch.
        path, offset, name: the file, the batch's first row in it and the column's name,
            for the error message.

    Raises:
        ValueError: an unsigned time above the int64 range, naming file, row and column.
    """
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    dtype = column.type
    if pa.types.is_uint64(dtype):
        values = to_numpy(column)
        above = np.flatnonzero(values > np.iinfo(np.int64).max)
        if above.size:
            row = int(above[0])
            where = f"{path}: row {offset + row}: " if path is not None else f"row {row}: "
            raise ValueError(
                f"{where}time column {name!r} holds {int(values[row])}, above the largest "
                f"time a store can keep ({np.iinfo(np.int64).max}, the int64 range)"
            )
    if pa.types.is_date(dtype):
        column = pc.cast(column, pa.timestamp("ns"))
    elif pa.types.is_timestamp(dtype) and dtype.unit != "ns":
        column = pc.cast(column, pa.timestamp("ns", tz=dtype.tz))
    if pa.types.is_timestamp(column.type):
        column = column.view(pa.int64())
    elif not pa.types.is_int64(column.type):
        column = pc.cast(column, pa.int64())
    return to_numpy(column)


# Nanoseconds per unit of the times `to_int64_time` turns into int64 nanoseconds.
_NS_PER_UNIT = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def first_beyond_nanoseconds(column: pa.Array | pa.ChunkedArray) -> tuple[int, str]:
    """`(row, shown)`: the first timestamp or date of `column` beyond int64 nanoseconds
    (row 0 where none is) and the value as text, for a message."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    kind = column.type
    if pa.types.is_date32(kind):
        per_unit, raw = 86_400 * 10**9, pc.cast(column, pa.int32())
    elif pa.types.is_date64(kind):
        per_unit, raw = 10**6, pc.cast(column, pa.int64())
    else:
        per_unit, raw = _NS_PER_UNIT.get(getattr(kind, "unit", "ns"), 1), column.view(pa.int64())
    numbers = raw.to_numpy(zero_copy_only=False).astype(np.int64)
    limit = 2**63 // per_unit
    beyond = np.flatnonzero((numbers >= limit) | (numbers < -limit))
    row = int(beyond[0]) if beyond.size else 0
    try:
        shown = str(column[row].as_py())
    except (ValueError, OverflowError):  # beyond what Python's datetime holds, too
        shown = f"{int(numbers[row])} ({kind})"
    return row, shown
