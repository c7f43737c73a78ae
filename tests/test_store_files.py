"""`MappedFile`: resident memory stays within its budget however far apart the written
rows lie (input dealt among files writes every 64th row of its entities). Temporary
directories of killed ingests: which are reaped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadist.store import files, ingest
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


def test_only_this_machines_temporaries_of_dead_processes_are_reaped_at_once(tmp_path):
    """An ingest into OUT on a shared file system never removes another node's live
    temporary directory (its pid means nothing here), only one untouched for a week."""
    src = tmp_path / "panel.parquet"
    table = pa.table({"e": ["a"] * 4, "t": range(4), "v": np.arange(4, dtype=np.float64)})
    pq.write_table(table, src)
    dead = _dead_pid()
    host = socket.gethostname()
    week_ago = time.time() - 8 * 24 * 3600
    names = {
        f"{dead}@{host}-00000001": False,  # this machine, process gone: reaped
        f"{os.getpid()}@{host}-00000002": True,  # this machine, alive: kept
        f"{dead}@other-node-03-00000003": True,  # another node, written to lately: kept
        f"{dead}@other-node-03-00000004": False,  # another node, untouched a week: reaped
        f"{dead}-00000005": True,  # pid alone, recent: kept
        f"{dead}-00000006": False,  # pid alone, process gone, untouched a week: reaped
    }
    for name in names:
        temp = tmp_path / f".store.ingest-{name}"
        temp.mkdir()
        (temp / "values.bin").write_bytes(b"\0" * 64)
        if name.endswith(("4", "6")):
            for path in (temp / "values.bin", temp):
                os.utime(path, (week_ago, week_ago))
    ingest(src, tmp_path / "store", entity_col="e", time_col="t", features=["v"], progress=False)
    for name, kept in names.items():
        assert (tmp_path / f".store.ingest-{name}").exists() == kept, name


def _dead_pid() -> int:
    """The pid of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid
