"""Parquet input of `metadist ingest`: finding files, checking schemas, decoding batches."""

from __future__ import annotations

import glob
import hashlib
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metadist.store.arrow import to_numpy

_GLOB_CHARS = set("*?[")
T = TypeVar("T")
_MAX_INTERLEAVED_FILES = 256


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


def resolve_paths(src: str | Path, exclude: Path | None = None) -> list[Path]:
    """Parquet files named by `src`: a file, a directory (searched recursively, skipping
    names starting with `.` or `_`), or a glob pattern.

    Args:
        src: the input.
        exclude: a directory whose files are never input (the store being written, when
            it lies inside `src`).

    Raises:
        FileNotFoundError: nothing matches.
        ValueError: `src` or a directory below it cannot be read (permissions).
    """
    text = str(src)
    path = Path(text)
    try:
        path.stat()
    except PermissionError:
        raise ValueError(f"cannot read the input {text!r}: permission denied") from None
    except OSError:
        pass
    skipped = exclude.resolve() if exclude is not None else None
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(_walk(path, skipped))
        if not files:
            raise ValueError(f"empty input: directory {path} holds no files")
        return files
    if _GLOB_CHARS & set(text):
        files = sorted(
            Path(p)
            for p in glob.glob(text, recursive=True)
            if Path(p).is_file() and not _inside(Path(p), skipped)
        )
        if not files:
            raise FileNotFoundError(f"no files match the pattern {text!r}")
        return files
    raise FileNotFoundError(f"input {text!r} does not exist")


def _walk(root: Path, skipped: Path | None) -> Iterator[Path]:
    """Files below `root`, skipping hidden (`.`) and private (`_`) names and `skipped`."""

    def refuse(error: OSError) -> None:
        raise ValueError(
            f"cannot read directory {error.filename} of the input {root}: "
            f"{error.strerror.lower() if error.strerror else error}"
        )

    for directory, subdirectories, names in os.walk(root, onerror=refuse):
        here = Path(directory)
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if not name.startswith((".", "_")) and not _inside(here / name, skipped)
        )
        for name in names:
            candidate = here / name
            if not name.startswith((".", "_")) and candidate.is_file():
                yield candidate


def _inside(path: Path, directory: Path | None) -> bool:
    if directory is None:
        return False
    resolved = path.resolve()
    return resolved == directory or directory in resolved.parents


def open_parquet(path: Path, read_dictionary: Sequence[str] = ()) -> pq.ParquetFile:
    """Opens one Parquet file, turning Arrow's errors into a message naming the file."""
    try:
        return pq.ParquetFile(path, read_dictionary=list(read_dictionary) or None)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{path} is not a readable Parquet file: {error}") from error


def _is_numeric(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype)


def _is_time(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_timestamp(dtype) or pa.types.is_date(dtype)


def _value_type(dtype: pa.DataType) -> pa.DataType:
    return dtype.value_type if pa.types.is_dictionary(dtype) else dtype


def check_sources(paths: list[Path], columns: Columns) -> tuple[list[SourceFile], pa.Schema]:
    """Opens every file and checks it against the first file's schema and `columns`.

    Returns:
        The files with their row counts, and the common schema.

    Raises:
        ValueError: a file is not Parquet, files differ in schema, a column is missing
            or has a type unfit for its role.
    """
    files: list[SourceFile] = []
    schema: pa.Schema | None = None
    first: Path | None = None
    for path in paths:
        parquet = open_parquet(path)
        file_schema = parquet.schema_arrow
        if schema is None:
            schema, first = file_schema, path
            _check_roles(path, schema, columns)
        else:
            _check_same_schema(first, schema, path, file_schema)
        stat = path.stat()
        files.append(SourceFile(path, parquet.metadata.num_rows, stat.st_size, stat.st_mtime_ns))
    assert schema is not None
    return files, schema


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


def _check_same_schema(first: Path, schema: pa.Schema, path: Path, other: pa.Schema) -> None:
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


def iter_all_batches(
    files: list[SourceFile], columns: list[str], batch_size: int, dictionary_columns: Sequence[str]
) -> Iterator[tuple[SourceFile, int, pa.RecordBatch]]:
    """Yields `(file, first_row_in_file, batch)` over all files: row group 0 of every
    file, then row group 1 of every file, and so on.

    Writers that deal rows over several files (Spark, Dask, the synthetic panel) put
    related rows into the same row group index of each file; reading them together keeps
    the store region that a stretch of batches writes to small.

    Raises:
        ValueError: a file cannot be read (corrupt pages, truncated file).
    """
    if len(files) > _MAX_INTERLEAVED_FILES:  # bounded number of open files
        for file in files:
            for offset, batch in iter_batches(file, columns, batch_size, dictionary_columns):
                yield file, offset, batch
        return
    readers = []
    for file in files:
        parquet = open_parquet(file.path, dictionary_columns)
        sizes = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
        readers.append((file, parquet, np.concatenate([[0], np.cumsum(sizes)]).astype(int)))
    num_groups = max(len(starts) - 1 for _, _, starts in readers)
    for group in range(num_groups):
        for file, parquet, starts in readers:
            if group >= len(starts) - 1:
                continue
            offset = int(starts[group])
            try:
                for batch in parquet.iter_batches(
                    batch_size=batch_size, row_groups=[group], columns=columns
                ):
                    yield file, offset, batch
                    offset += batch.num_rows
            except (pa.ArrowException, OSError) as error:
                raise ValueError(f"{file.path} is corrupt near row {offset}: {error}") from error


def first_null(array: pa.Array) -> int | None:
    """Position of the first null in `array`, or None."""
    if array.null_count == 0:
        return None
    return int(np.flatnonzero(to_numpy(pc.is_null(array)))[0])


def float_columns(batch: pa.RecordBatch, names: Sequence[str]) -> list[np.ndarray]:
    """The numeric columns `names` as `[N]` float64 arrays (zero-copy where possible;
    nulls become NaN)."""
    out = []
    for name in names:
        column = batch.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        values = to_numpy(column)
        out.append(values if values.dtype == np.float64 else values.astype(np.float64))
    return out


def prefetch(iterator: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Runs `iterator` in a background thread, `depth` items ahead, so that Parquet
    decoding (which releases the GIL) overlaps the caller's numpy work. Exceptions of
    the iterator are re-raised in the caller."""
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        items.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put((done, None))
        except BaseException as error:  # handed to the consumer
            items.put((done, error))

    thread = threading.Thread(target=produce, name="metadist-parquet-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = items.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                items.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.05)


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
