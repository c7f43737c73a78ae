"""`MappedFile`: resident memory stays within its budget however far apart the written
rows lie (input dealt among files writes every 64th row of its entities)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from metadist.store import files
from metadist.store.files import PAGE_BYTES, MappedFile


def _resident_file_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("stride_pages", [1, 8])
def test_rows_far_apart_stay_within_the_budget(tmp_path, stride_pages):
    row_bytes = 32
    num_rows = (128 << 20) // row_bytes  # a 128 MB file
    budget = 4 << 20
    stride = stride_pages * PAGE_BYTES // row_bytes  # one row per page touched
    with MappedFile(
        tmp_path / "values.bin", np.dtype(np.float32), (num_rows, 8), release_bytes=budget
    ) as mapped:
        before = _resident_file_bytes()
        peak = 0
        rows = np.arange(0, num_rows, stride)
        for batch in np.array_split(rows, 64):  # batches like pass 2's
            mapped.array[batch] = 1.0
            mapped.wrote(batch)
            peak = max(peak, _resident_file_bytes() - before)
        touched = rows.size * PAGE_BYTES
        assert touched >= 4 * budget  # far more than the budget was written
        assert peak <= budget + touched // 64 + (1 << 20)  # + one batch, + slack
        np.testing.assert_array_equal(mapped.array[rows[::97]], 1.0)


def test_rows_together_are_counted_by_their_bytes(tmp_path, monkeypatch):
    """The count of pages written (the measure where resident memory cannot be read):
    a page holds many rows that lie together."""
    monkeypatch.setattr(files, "_resident_file_bytes", lambda: None)
    with MappedFile(
        tmp_path / "values.bin", np.dtype(np.float32), (1 << 16, 8), release_bytes=64 << 20
    ) as mapped:
        mapped.wrote(np.arange(1000, 1000 + 8192))  # 256 KB of rows: 65 pages
        assert mapped._pending == 65 * PAGE_BYTES
        mapped.wrote(np.arange(0, 1 << 16, 4096))  # 16 rows, 16 pages far apart
        assert mapped._pending == 81 * PAGE_BYTES
