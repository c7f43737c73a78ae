"""Atomicity of `ingest`: a process killed with SIGKILL at any point leaves no store at
OUT, an earlier store at OUT exactly as it was, and no worker behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from store_panel import make_panel, write_files

from metadist.store import SeriesStore, ingest
from metadist.store.format import METADATA_FILE, VALUES_FILE, file_checksum
from metadist.store.verify import verify

OPTIONS = dict(entity_col="entity", time_col="t", features=["a", "b"], targets=["y"])

CHILD = """
import sys
from metadist.store import ingest
ingest(sys.argv[1], sys.argv[2], entity_col="entity", time_col="t", features=["a", "b"],
       targets=["y"], stratum_col="kind", scaling="per-entity", batch_size=64, workers=3,
       progress=False)
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    panel = make_panel(seed=11, num_entities=300, length_range=(150, 350))
    return write_files(panel, tmp_path_factory.mktemp("kill-src"), num_files=3)


def _kill_during(source: Path, out: Path, phase: str) -> None:
    """Starts an ingest into `out` in a child process and SIGKILLs it during `phase`:
    "scan" (temporary directory made, no values yet) or "write" (values.bin exists)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(source), str(out)])
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            temps = list(out.parent.glob(f".{out.name}.ingest-*"))
            if temps and (phase == "scan" or (temps[0] / VALUES_FILE).exists()):
                break
            assert child.poll() is None, "ingest finished before it could be killed"
            time.sleep(0.002)
        else:
            pytest.fail(f"ingest never reached the {phase} phase")
        descendants = _descendants(child.pid)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    time.sleep(0.2)
    assert [pid for pid in descendants if Path(f"/proc/{pid}").exists()] == []


def _descendants(pid: int) -> list[int]:
    """Processes started by `pid` and their own, from /proc (Linux)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            found += [int(c) for c in children]
            todo += [int(c) for c in children]
    return found


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("phase", ["scan", "write"])
def test_sigkill_leaves_no_store(tmp_path, source, phase):
    out = tmp_path / "store"
    _kill_during(source, out, phase)
    assert not out.exists()
    # The next ingest into the same OUT removes the dead process's temporary directory.
    ingest(source, out, progress=False, **OPTIONS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    verify(out)


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("phase", ["scan", "write"])
def test_sigkill_keeps_existing_store_intact(tmp_path, source, phase):
    out = tmp_path / "store"
    before = ingest(source, out, scaling="global", progress=False, **OPTIONS)
    values_before = np.array(before.values)
    metadata_before = (out / METADATA_FILE).read_bytes()
    checksum_before = file_checksum(out / VALUES_FILE)
    del before
    _kill_during(source, out, phase)
    assert (out / METADATA_FILE).read_bytes() == metadata_before
    assert file_checksum(out / VALUES_FILE) == checksum_before
    after = verify(out)
    np.testing.assert_array_equal(np.asarray(after.values), values_before)
    assert SeriesStore.open(out).metadata["scaling"]["kind"] == "global"
