"""`metadist verify PATH`: a full check of a store, beyond what `SeriesStore.open` does.

Covers every file of a store: recomputes the checksums of `values.bin` and `times.bin`
(streamed), and of `index.arrow`, `entity_stats.npz` and `metadata.json`'s own fields
where the store records them (stores ingested before it did lack them); reads `metadata.json` and `index.arrow`
(opening the store) and checks that the index tiles the rows; reads `entity_stats.npz` whole (required with per-entity
scaling) and checks its arrays' shapes and values; checks that times increase strictly
within every entity and that every value is finite.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from metadist.progress import Counter, Progress
from metadist.store.format import (
    ENTITY_STATS_FILE,
    INDEX_FILE,
    METADATA_CHECKSUM,
    METADATA_FILE,
    TIMES_DTYPE,
    TIMES_FILE,
    VALUES_DTYPE,
    VALUES_FILE,
    file_checksum,
    metadata_checksum,
    read_metadata,
)
from metadist.store.reader import SeriesStore, read_entity_stats

_CHUNK_ROWS = 1 << 20


def verify(path: str | Path, progress: bool | None = None) -> SeriesStore:
    """Checks the store at `path` in full.

    Args:
        path: the store directory.
        progress: show the MB read so far on stderr (`metadist.progress`): a bar where
            true, or for None on a terminal, else a line every 15 seconds.

    Returns:
        The opened store, if every check passes.

    Raises:
        FileNotFoundError: no store at `path`, or a file of it is missing.
        ValueError: naming the first problem found (checksum mismatch, unsorted or
            repeated times within an entity, non-finite values, inconsistent metadata).
    """
    store = SeriesStore.open(path)
    meta = store.metadata
    _check_metadata(store)
    size = sum((store.path / name).stat().st_size for name in (VALUES_FILE, TIMES_FILE))
    with Progress(progress, transient=True) as display:  # both files are read twice
        read = _Read(display.counter("verify", max(2 * size >> 20, 1), "MB", rate=True))
        _check_checksums(store, (VALUES_FILE, TIMES_FILE), required=True, read=read)
        _check_entity_stats(store)
        _check_checksums(store, (INDEX_FILE, ENTITY_STATS_FILE), required=False)
        if len(meta["column_names"]) != len(
            dict.fromkeys([*meta["feature_names"], *meta["target_names"]])
        ):
            raise ValueError(f"store {store.path}: column names do not match features and targets")
        _check_rows(store, read)
    return store


class _Read:
    """Bytes of `values.bin` and `times.bin` read so far, shown by `counter` in MB."""

    def __init__(self, counter: Counter) -> None:
        self.counter, self.num_bytes = counter, 0

    def __call__(self, num_bytes: int) -> None:
        self.num_bytes += num_bytes
        self.counter.update(self.num_bytes >> 20)


def _check_rows(store: SeriesStore, read: Callable[[int], None] | None = None) -> None:
    """Times increase strictly within every entity and every value is finite, read in
    slices of `_CHUNK_ROWS` rows whatever the entities' lengths (memory stays bounded by
    the slice, not by the longest entity). Each slice also reads the row before it, so
    that an entity running across the boundary is compared there too. `read` is told
    the bytes of each slice."""
    starts = store.starts
    row_bytes = store.num_columns * VALUES_DTYPE.itemsize + TIMES_DTYPE.itemsize
    row_a = 0
    while row_a < store.num_rows:
        row_b = min(row_a + _CHUNK_ROWS, store.num_rows)
        before = max(row_a - 1, 0)  # the previous slice's last row
        times = np.asarray(store.times[before:row_b])
        entity = np.searchsorted(starts, np.arange(before, row_b), side="right") - 1
        bad = np.flatnonzero((entity[1:] == entity[:-1]) & (times[1:] <= times[:-1]))
        if bad.size:
            raise ValueError(
                f"store {store.path}: times of entity {store.entity_ids[entity[bad[0]]]!r} do "
                f"not increase strictly (row {before + int(bad[0]) + 1})"
            )
        values = np.asarray(store.values[row_a:row_b])
        finite = np.isfinite(values).all(axis=1)
        if not finite.all():
            row = row_a + int(np.flatnonzero(~finite)[0])
            raise ValueError(
                f"store {store.path}: entity {store.entity_ids[entity[row - before]]!r} has a "
                f"non-finite value at row {row}"
            )
        if read is not None:
            read((row_b - row_a) * row_bytes)
        row_a = row_b


def _check_metadata(store: SeriesStore) -> None:
    """`metadata.json` as ingest wrote it: its other fields still give the checksum it
    records (stores ingested before it recorded one are not checked)."""
    recorded = read_metadata(store.path)
    expected = recorded.get(METADATA_CHECKSUM)
    if expected is None:
        return
    actual = metadata_checksum(recorded)
    if actual != expected:
        raise ValueError(
            f"store {store.path}: {METADATA_FILE} is corrupt (its fields give checksum "
            f"{actual}, not the recorded {expected}: a value in it was changed); re-create "
            "the store with metadist ingest"
        )


def _check_checksums(
    store: SeriesStore,
    names: tuple[str, ...],
    *,
    required: bool,
    read: Callable[[int], None] | None = None,
) -> None:
    """Recomputes the checksums of the files `names` and compares them with the ones
    `metadata.json` records; a file without one is an error where `required` (stores
    ingested before the checksums of `index.arrow` and `entity_stats.npz` were recorded
    lack those). `read` is told the bytes of each piece read."""
    expected = store.metadata.get("checksums", {})
    for name in names:
        if name not in expected:
            if required:
                raise ValueError(f"store {store.path}: metadata.json has no checksum of {name}")
            continue
        if not (store.path / name).is_file():
            raise ValueError(
                f"store {store.path}: {name} is missing; re-create the store with metadist ingest"
            )
        actual = file_checksum(store.path / name, read=read)
        if actual != expected[name]:
            raise ValueError(
                f"store {store.path}: {name} is corrupt (checksum {actual[:16]}... differs "
                f"from the recorded {expected[name][:16]}...); re-create it with metadist ingest"
            )


def _check_entity_stats(store: SeriesStore) -> None:
    """`entity_stats.npz`: present when per-entity scaling needs it, readable whole, four
    `[E, C]` arrays with positive counts and finite moments."""
    path = store.path / ENTITY_STATS_FILE
    if not path.is_file():
        if store.metadata.get("scaling", {}).get("kind") == "per-entity":
            raise ValueError(
                f"store {store.path}: {ENTITY_STATS_FILE} is missing, and its per-entity scaling "
                "needs it; re-create the store with metadist ingest"
            )
        return
    stats = read_entity_stats(store.path, (store.num_entities, store.num_columns))
    for key, array in stats.items():
        if not np.isfinite(array).all():
            raise ValueError(f"store {store.path}: {ENTITY_STATS_FILE} has non-finite {key}")
