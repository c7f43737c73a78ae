"""The cheaper code paths of the ingest give the plain paths' results bit for bit: the
per-batch moments, whole reads of small row groups, and pass 2's mappings released
before the early finisher's writeback."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from store_panel import make_panel, write_files

from metadist.store import ingest, order, sources
from metadist.store.batch_stats import moments, nonfinite
from metadist.store.files import PAGE_BYTES, MappedFile
from metadist.store.format import METADATA_FILE, STORE_FILES
from metadist.store.settings import MAX_TIME, NO_TIME


def _moments_by_masks(local, times, values, masks, num_local):
    """The moments as they were computed before (full-length masks, `np.where`)."""
    rows = np.bincount(local, minlength=num_local)
    first = np.full(num_local, MAX_TIME, np.int64)
    last = np.full(num_local, NO_TIME, np.int64)
    np.minimum.at(first, local, times)
    np.maximum.at(last, local, times)
    count = np.empty((num_local, len(values)))
    total = np.empty((num_local, len(values)))
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
    m2 = np.empty_like(total)
    for j, column in enumerate(values):
        deviation = column - mean[:, j][local]
        if j in masks:
            deviation = np.where(masks[j], deviation, 0.0)
        m2[:, j] = np.bincount(local, weights=deviation * deviation, minlength=num_local)
    return rows, first, last, count, mean, m2


@pytest.mark.parametrize("seed", range(4))
def test_moments_equal_the_masked_formulation_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    num_rows, num_local = 5000, 37
    local = rng.integers(0, num_local, num_rows)
    times = rng.integers(-(10**12), 10**12, num_rows)
    values = [
        rng.normal(3.0, 2.0, num_rows),
        (rng.normal(0.0, 1e3, num_rows)).astype(np.float32),
        rng.normal(-1.0, 1e-3, num_rows),
        np.zeros(num_rows),
    ]
    values[0][rng.choice(num_rows, 60, replace=False)] = np.nan
    values[1][rng.choice(num_rows, 9, replace=False)] = np.inf
    values[2][local == 5] = np.nan  # an entity without a finite value in a column
    values[3][::2] = -0.0  # signed zeros: a sum of -0.0 and 0.0 keeps its sign rules
    values[3][rng.choice(num_rows, 30, replace=False)] = -np.inf
    masks = nonfinite(values)
    assert sorted(masks) == [0, 1, 2, 3]
    for got, expected in zip(
        moments(local, times, values, masks, num_local),
        _moments_by_masks(local, times, values, masks, num_local),
        strict=True,
    ):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


def _store_bytes(path: Path) -> dict[str, bytes]:
    found = {name: (path / name).read_bytes() for name in STORE_FILES if name != METADATA_FILE}
    meta = json.loads((path / METADATA_FILE).read_text())
    for key in ("created_at", "timings_s", "metadata_checksum"):  # the last covers the others
        meta.pop(key)
    found[METADATA_FILE] = json.dumps(meta, sort_keys=True).encode()
    return found


def _ingest(src: Path, out: Path, workers: int):
    return ingest(
        src,
        out,
        entity_col="entity",
        time_col="t",
        features=["a", "b"],
        targets=["y"],
        stratum_col="kind",
        nan="ffill",
        scaling="per-entity",
        batch_size=50,
        workers=workers,
        progress=False,
    )


def test_whole_row_group_reads_give_the_buffered_reads_store(tmp_path, monkeypatch):
    panel = make_panel(seed=4, num_entities=50, times="mixed")
    a = panel["a"].to_numpy().copy()
    a[::13] = np.nan
    panel = panel.set_column(panel.schema.get_field_index("a"), "a", pa.array(a))
    src = write_files(panel, tmp_path / "src", num_files=3, seed=2)
    paths = sorted(src.glob("*.parquet"))
    units = sources.units([sources.SourceFile(p, 0, 0, 0) for p in paths])
    assert all(0 < unit.num_bytes <= sources._WHOLE_READ_BYTES for unit in units)
    whole = _store_bytes(_ingest(src, tmp_path / "whole", 2).path)
    monkeypatch.setattr(sources, "_WHOLE_READ_BYTES", 0)  # every row group buffered
    buffered = _store_bytes(_ingest(src, tmp_path / "buffered", 2).path)
    assert whole == buffered


def test_released_rows_keep_their_bytes_and_take_writes_again(tmp_path):
    """`release_rows` drops pages from the mapping, never their contents: the file
    holds what was written, and the rows can be written again through the mapping."""
    row_bytes = 24
    num_rows = 64 * PAGE_BYTES // row_bytes
    path = tmp_path / "values.bin"
    with MappedFile(path, np.dtype(np.float32), (num_rows, 6)) as mapped:
        expected = np.arange(num_rows * 6, dtype=np.float32).reshape(num_rows, 6)
        mapped.array[:] = expected
        mapped.release_rows(100, num_rows - 100)  # pages shared with rows outside stay
        fd = os.open(path, os.O_RDONLY)
        try:
            on_file = np.frombuffer(os.pread(fd, num_rows * row_bytes, 0), np.float32)
        finally:
            os.close(fd)
        np.testing.assert_array_equal(on_file.reshape(num_rows, 6), expected)
        np.testing.assert_array_equal(mapped.array, expected)
        mapped.array[200:300] = -1.0
        mapped.release_rows(0, num_rows)
        np.testing.assert_array_equal(mapped.array[200:300], -1.0)
        np.testing.assert_array_equal(mapped.array[300:], expected[300:])


def test_the_early_finisher_never_touches_pass_2_mappings_once_closed(tmp_path, monkeypatch):
    """The finisher thread outlives pass 2 (it is stopped by pass 3): the pages it
    releases are pass 2's only while pass 2 holds its mappings open."""
    monkeypatch.setattr(order, "_chunk_rows", lambda settings: 60)
    closed: set[int] = set()
    late: list[int] = []
    exit_mapping, release_rows = MappedFile.__exit__, MappedFile.release_rows

    def exiting(self, *exc_info):
        closed.add(id(self))
        exit_mapping(self, *exc_info)

    def releasing(self, first_row, end_row):
        if id(self) in closed:
            late.append(first_row)
        release_rows(self, first_row, end_row)

    def slow_chunk(*args):  # the finisher lags behind pass 2
        time.sleep(0.002)
        return order_chunk(*args)

    order_chunk = order._order_chunk
    monkeypatch.setattr(MappedFile, "__exit__", exiting)
    monkeypatch.setattr(MappedFile, "release_rows", releasing)
    monkeypatch.setattr(order, "_order_chunk", slow_chunk)
    stop = order.EarlyFinisher.stop

    def stop_when_caught_up(self):  # every chunk ready at the end of pass 2 taken late
        deadline = time.monotonic() + 60
        while self.error is None and self.done < self.ready and time.monotonic() < deadline:
            time.sleep(0.005)
        stop(self)

    monkeypatch.setattr(order.EarlyFinisher, "stop", stop_when_caught_up)
    panel = make_panel(seed=5, num_entities=80, times="steps")
    src = write_files(panel, tmp_path / "src", num_files=3, seed=3)
    two = _store_bytes(_ingest(src, tmp_path / "two", 2).path)
    assert not late
    one = _store_bytes(_ingest(src, tmp_path / "one", 1).path)
    assert one == two
