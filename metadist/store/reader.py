"""`SeriesStore`: read-only, memory-mapped access to a store written by `metadist ingest`."""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from metadist.store.arrow import to_numpy
from metadist.store.format import (
    ENTITY_STATS_FILE,
    INDEX_COLUMNS,
    INDEX_FILE,
    TIMES_DTYPE,
    TIMES_FILE,
    VALUES_DTYPE,
    VALUES_FILE,
    read_metadata,
)
from metadist.store.scaler import Scaler
from metadist.store.schema import StoreColumns

# Variable-width strings for entity ids (numpy >= 2); Python objects on older numpy.
_ID_DTYPE = getattr(getattr(np, "dtypes", None), "StringDType", lambda: object)()
ENTITY_STATS_KEYS = ("count", "mean", "m2", "std")  # the arrays of entity_stats.npz


def _codes_and_names(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """`[E]` int64 codes into sorted unique names, and the `[U]` str names."""
    encoded = column.combine_chunks().dictionary_encode()
    names = np.asarray(encoded.dictionary.to_pylist(), dtype=str)
    order = np.argsort(names, kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank[to_numpy(encoded.indices)], names[order]


def _first_null(column: pa.ChunkedArray) -> int:
    """Row of the first null of a column that has one."""
    return int(np.flatnonzero(to_numpy(column.is_null().combine_chunks()))[0])


def read_entity_stats(path: Path, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """The four `[E, C]` arrays of the store `path`'s `entity_stats.npz`, read whole.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: it is truncated, corrupt or not an archive of four `[E, C]` arrays
            (`shape`), naming the file.
    """
    stats_path = Path(path) / ENTITY_STATS_FILE
    if not stats_path.is_file():
        raise FileNotFoundError(f"store {path} is damaged: {ENTITY_STATS_FILE} is missing")
    try:
        with np.load(stats_path, allow_pickle=False) as archive:
            stats = {key: np.asarray(archive[key]) for key in ENTITY_STATS_KEYS}
    except Exception as error:  # noqa: BLE001 - a truncated zip fails in many ways
        text = str(error).strip().splitlines()
        raise ValueError(
            f"store {path} is damaged: {stats_path} is unreadable ({type(error).__name__}"
            f"{': ' + text[0] if text else ''}); re-create the store with metadist ingest"
        ) from None
    for key, array in stats.items():
        if array.shape != tuple(shape):
            raise ValueError(
                f"store {path} is damaged: {stats_path} holds {key} of shape {array.shape}, "
                f"expected {tuple(shape)}; re-create the store with metadist ingest"
            )
    return stats


@dataclass
class _Mapped:
    """The opened state of a store: metadata, entity index and the two memory maps."""

    metadata: dict[str, Any]
    index: pa.Table
    starts: np.ndarray
    lengths: np.ndarray
    values: np.memmap
    times: np.memmap

    @classmethod
    def load(cls, path: Path) -> _Mapped:
        metadata = read_metadata(path)
        num_rows = int(metadata["num_rows"])
        num_entities = int(metadata["num_entities"])
        column_names = list(metadata["column_names"])
        num_columns = len(column_names)
        for name, expected, layout in (
            (
                VALUES_FILE,
                num_rows * num_columns * VALUES_DTYPE.itemsize,
                f"{num_rows} rows x {num_columns} columns x {VALUES_DTYPE.itemsize} bytes",
            ),
            (
                TIMES_FILE,
                num_rows * TIMES_DTYPE.itemsize,
                f"{num_rows} rows x {TIMES_DTYPE.itemsize} bytes",
            ),
        ):
            file = path / name
            if not file.is_file():
                raise FileNotFoundError(f"store {path} is damaged: {name} is missing")
            size = file.stat().st_size
            if size != expected:
                raise ValueError(
                    f"store {path} is damaged: {name} has {size} bytes but its metadata "
                    f"needs {expected} ({layout}); the file "
                    "is truncated or belongs to another store"
                )
        index_path = path / INDEX_FILE
        if not index_path.is_file():
            raise FileNotFoundError(f"store {path} is damaged: {INDEX_FILE} is missing")
        try:
            with pa.memory_map(str(index_path)) as source:
                index = pa.ipc.open_file(source).read_all()
        except (pa.ArrowInvalid, OSError) as error:
            raise ValueError(
                f"store {path} is damaged: {INDEX_FILE} is unreadable: {error}"
            ) from error
        if tuple(index.column_names) != INDEX_COLUMNS or index.num_rows != num_entities:
            raise ValueError(
                f"store {path} is damaged: {INDEX_FILE} has columns {index.column_names} and "
                f"{index.num_rows} rows; expected {list(INDEX_COLUMNS)} and {num_entities} rows"
            )
        for name in INDEX_COLUMNS:
            column = index[name]
            if column.null_count:
                row = _first_null(column)
                raise ValueError(
                    f"store {path} is damaged: {INDEX_FILE}: row {row}: column {name!r} is "
                    "null; re-create the store with metadist ingest"
                )
        starts = to_numpy(index["start"]).astype(np.int64)
        lengths = to_numpy(index["length"]).astype(np.int64)
        if num_entities and (
            starts[0] != 0
            or np.any(lengths <= 0)
            or np.any(starts[1:] != starts[:-1] + lengths[:-1])
            or starts[-1] + lengths[-1] != num_rows
        ):
            raise ValueError(
                f"store {path} is damaged: entity starts and lengths in {INDEX_FILE} do not "
                f"tile the {num_rows} rows of {VALUES_FILE}"
            )
        values = np.memmap(
            path / VALUES_FILE, dtype=VALUES_DTYPE, mode="r", shape=(num_rows, num_columns)
        )
        times = np.memmap(path / TIMES_FILE, dtype=TIMES_DTYPE, mode="r", shape=(num_rows,))
        return cls(metadata, index, starts, lengths, values, times)


class SeriesStore(StoreColumns):
    """A series store opened read-only.

    `values` and `times` are memory maps; `series(i)` is a view into them, so reading a
    window copies nothing until the caller gathers it. The entity index is loaded once
    (columnar, fast even for a million entities).

    Pickling carries the path and the checksums `metadata.json` recorded: the store
    reopens lazily in the receiving process, so it can be handed to fork or spawn workers
    and DataLoader workers, and one replaced at the same path since is refused there.

    Attributes:
        path: the store directory.
    """

    def __init__(self, path: str | Path) -> None:
        """Prefer `SeriesStore.open(path)`, which validates eagerly."""
        self.path = Path(path)
        self._mapped: _Mapped | None = None
        self._fds: tuple[int, int] | None = None
        self._expected: dict[str, Any] | None = None  # the checksums a pickle carried

    @classmethod
    def open(cls, path: str | Path) -> SeriesStore:
        """Opens the store at `path`, checking its format version and file sizes.

        Raises:
            FileNotFoundError: no directory, or a store file is missing.
            ValueError: a foreign directory, another format version, or a store whose
                files are truncated or inconsistent with its metadata.
        """
        store = cls(path)
        store._mapped = _Mapped.load(store.path)
        return store

    @property
    def _m(self) -> _Mapped:
        if self._mapped is None:
            mapped = _Mapped.load(self.path)
            found = mapped.metadata.get("checksums")
            if self._expected is not None and found != self._expected:
                raise ValueError(
                    f"store {self.path} was replaced after this process was handed it: "
                    f"metadata.json records other checksums ({found} against "
                    f"{self._expected}); a store is not re-ingested under a running job"
                )
            self._mapped = mapped
        return self._mapped

    # Pickle as the path and its checksums; the receiving process maps the files itself.
    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = {"path": str(self.path)}
        if self._mapped is not None or self._expected is not None:
            state["checksums"] = self.metadata.get("checksums")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = Path(state["path"])
        self._mapped = None
        self._fds = None
        self._expected = state.get("checksums")

    def __del__(self) -> None:
        fds = getattr(self, "_fds", None)
        if fds is not None:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    @property
    def metadata(self) -> dict[str, Any]:
        """The parsed `metadata.json`."""
        return self._m.metadata

    def __repr__(self) -> str:
        return f"SeriesStore({str(self.path)!r})"

    def __len__(self) -> int:
        return self.num_entities

    @property
    def num_entities(self) -> int:
        """E, the number of entities."""
        return int(self.metadata["num_entities"])

    @property
    def num_rows(self) -> int:
        """Total rows over all entities."""
        return int(self.metadata["num_rows"])

    def column_index(self, names: str | Sequence[str]) -> list[int]:
        """Column positions of `names` in `values`' last dimension.

        Raises:
            ValueError: a name is not a store column.
        """
        if isinstance(names, str):
            names = [names]
        columns = self.column_names
        unknown = [name for name in names if name not in columns]
        if unknown:
            raise ValueError(f"store {self.path} has no columns {unknown}; it has {columns}")
        return [columns.index(name) for name in names]

    @property
    def starts(self) -> np.ndarray:
        """`[E]` int64 first row of each entity."""
        return self._m.starts

    @property
    def lengths(self) -> np.ndarray:
        """`[E]` int64 number of rows of each entity."""
        return self._m.lengths

    @property
    def values(self) -> np.memmap:
        """`[num_rows, C]` float32 read-only memory map, entity-major, time-sorted."""
        return self._m.values

    @property
    def times(self) -> np.memmap:
        """`[num_rows]` int64 read-only memory map of row times."""
        return self._m.times

    @cached_property
    def entity_ids(self) -> np.ndarray:
        """`[E]` entity ids as variable-width strings (indexing gives `str`).

        Memory follows the total length of the ids, not E times the longest one (a
        fixed-width unicode array spends 4 bytes per character of the longest id on
        every entity): numpy's `StringDType` where available (numpy >= 2), else objects.
        """
        return np.asarray(self._m.index["entity_id"].to_pylist(), dtype=_ID_DTYPE)

    @cached_property
    def _strata(self) -> tuple[np.ndarray, np.ndarray]:
        return _codes_and_names(self._m.index["stratum"])

    @cached_property
    def _labels(self) -> tuple[np.ndarray, np.ndarray]:
        return _codes_and_names(self._m.index["label"])

    @property
    def stratum_codes(self) -> np.ndarray:
        """`[E]` int64 index of each entity's stratum in `stratum_names`."""
        return self._strata[0]

    @property
    def stratum_names(self) -> np.ndarray:
        """Sorted unique stratum names (`[""]` when ingested without a stratum column)."""
        return self._strata[1]

    @property
    def strata(self) -> np.ndarray:
        """`[E]` str stratum of each entity."""
        return self.stratum_names[self.stratum_codes]

    @property
    def label_codes(self) -> np.ndarray:
        """`[E]` int64 index of each entity's label in `label_names`."""
        return self._labels[0]

    @property
    def label_names(self) -> np.ndarray:
        """Sorted unique labels (`[""]` when ingested without a label column)."""
        return self._labels[1]

    @property
    def labels(self) -> np.ndarray:
        """`[E]` str label of each entity."""
        return self.label_names[self.label_codes]

    def has_label(self, labels: Sequence[str] | str) -> np.ndarray:
        """`[E]` bool: the entities whose label is one of `labels`.

        Raises:
            ValueError: an empty list, or a label no entity of the store has (naming the
                store's labels).
        """
        wanted = [labels] if isinstance(labels, str) else [str(x) for x in labels]
        known = [str(x) for x in self.label_names]
        unknown = [x for x in wanted if x not in known]
        if not wanted or unknown:
            what = f"has no label {unknown[0]!r}" if unknown else "got an empty labels list"
            raise ValueError(f"store {self.path} {what}; its labels: {', '.join(known)}")
        return np.isin(self.labels.astype(str), wanted)

    def _check_entity(self, i: int) -> int:
        i = int(i)
        if not -self.num_entities <= i < self.num_entities:
            raise IndexError(f"entity {i} out of range for {self.num_entities} entities")
        return i % self.num_entities

    def series(self, i: int) -> np.ndarray:
        """`[length_i, C]` float32 zero-copy view of entity i's rows, time-sorted."""
        i = self._check_entity(i)
        start = self._m.starts[i]
        return self._m.values[start : start + self._m.lengths[i]]

    def series_times(self, i: int) -> np.ndarray:
        """`[length_i]` int64 zero-copy view of entity i's times, increasing."""
        i = self._check_entity(i)
        start = self._m.starts[i]
        return self._m.times[start : start + self._m.lengths[i]]

    @cached_property
    def entity_stats(self) -> dict[str, np.ndarray]:
        """Per-entity moments of each column in original units: `count`, `mean`, `m2`,
        `std`, each `[E, C]` float64 (`std` is the scale per-entity scaling uses)."""
        return read_entity_stats(self.path, (self.num_entities, self.num_columns))

    @cached_property
    def scaler(self) -> Scaler:
        """The `Scaler` that produced `values` (its `inverse` restores original units)."""
        scaling = self.metadata["scaling"]
        kind = scaling["kind"]
        if kind == "per-entity":
            stats = self.entity_stats
            return Scaler(kind, stats["mean"], stats["std"])
        if kind == "global":
            return Scaler(kind, np.asarray(scaling["mean"]), np.asarray(scaling["std"]))
        num_columns = self.num_columns
        return Scaler(kind, np.zeros(num_columns), np.ones(num_columns))

    # ------------------------------------------------------------ page-cache advice
    def _byte_ranges(
        self, first_rows: np.ndarray, end_rows: np.ndarray
    ) -> list[tuple[int, int, np.ndarray]]:
        """`(fd, row_bytes, [M, 2] merged page-aligned byte ranges)` of both files."""
        if self._fds is None:
            self._fds = (
                os.open(self.path / VALUES_FILE, os.O_RDONLY),
                os.open(self.path / TIMES_FILE, os.O_RDONLY),
            )
        first = np.asarray(first_rows, dtype=np.int64).reshape(-1)
        end = np.asarray(end_rows, dtype=np.int64).reshape(-1)
        keep = end > first
        order = np.argsort(first[keep], kind="stable")
        first, end = first[keep][order], end[keep][order]
        out = []
        row_bytes = (self.num_columns * VALUES_DTYPE.itemsize, TIMES_DTYPE.itemsize)
        for fd, size in zip(self._fds, row_bytes, strict=True):
            low = first * size // _PAGE * _PAGE
            high = -(-end * size // _PAGE) * _PAGE
            out.append((fd, size, _merge_ranges(low, high, _MERGE_GAP_BYTES)))
        return out

    def will_need(self, first_rows: np.ndarray, end_rows: np.ndarray) -> int:
        """Asks the kernel to read store rows `[first_rows[i], end_rows[i])` ahead, without
        waiting (`posix_fadvise` WILLNEED on `values.bin` and `times.bin`).

        Ranges closer than 64 KiB are merged and all are issued in file order, so the disk
        sees few reads in increasing order. Changes nothing that is read.

        Returns:
            The number of byte ranges advised (0 where the OS has no `posix_fadvise`).
        """
        if not hasattr(os, "posix_fadvise"):
            return 0
        count = 0
        for fd, _, ranges in self._byte_ranges(first_rows, end_rows):
            for low, high in ranges.tolist():
                os.posix_fadvise(fd, low, high - low, os.POSIX_FADV_WILLNEED)
            count += len(ranges)
        return count

    def release(self, first_row: int, end_row: int) -> None:
        """Drops store rows `[first_row, end_row)` from this process's mapping and from
        the page cache (`madvise` and `posix_fadvise` DONTNEED): for pages no task needs
        soon, so the cache keeps those about to be used. Reading them again goes to the
        disk; the values read are unchanged."""
        if not hasattr(os, "posix_fadvise"):
            return
        mapped = (self.values, self.times)
        for (fd, _, ranges), array in zip(
            self._byte_ranges(np.array([first_row]), np.array([end_row])), mapped, strict=True
        ):
            region = getattr(array, "_mmap", None)
            for low, high in ranges.tolist():
                high = min(high, array.nbytes)
                if high <= low:
                    continue
                if region is not None and hasattr(region, "madvise"):
                    region.madvise(mmap.MADV_DONTNEED, low, high - low)
                os.posix_fadvise(fd, low, high - low, os.POSIX_FADV_DONTNEED)


_PAGE = mmap.PAGESIZE
_MERGE_GAP_BYTES = 64 << 10


def _merge_ranges(low: np.ndarray, high: np.ndarray, gap: int) -> np.ndarray:
    """`[M, 2]` union of byte ranges `[low, high)` sorted by `low`, joining ranges whose
    gap is below `gap` (reading the gap costs less than another request)."""
    if len(low) == 0:
        return np.empty((0, 2), dtype=np.int64)
    reach = np.maximum.accumulate(high)
    starts_new = np.concatenate(([True], low[1:] >= reach[:-1] + gap))
    first = np.flatnonzero(starts_new)
    last = np.concatenate((first[1:], [len(low)])) - 1
    return np.stack((low[first], reach[last]), axis=1)
