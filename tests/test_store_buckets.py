"""Pass 2's buckets (`store/buckets.py`): chunks held in memory and chunks written through
the mapping give the same store byte for byte, whatever the budget and the workers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from store_panel import make_panel, write_files

from metadist.store import ingest, order, write
from metadist.store.buckets import Buckets
from metadist.store.format import METADATA_FILE, STORE_FILES


def _store_bytes(path: Path) -> dict[str, bytes]:
    found = {name: (path / name).read_bytes() for name in STORE_FILES if name != METADATA_FILE}
    meta = json.loads((path / METADATA_FILE).read_text())
    for key in ("created_at", "timings_s"):
        meta.pop(key)
    meta["source"].pop("path")
    found[METADATA_FILE] = json.dumps(meta, sort_keys=True).encode()
    return found


@pytest.fixture
def budgets(monkeypatch):
    """Pass 3 in chunks of a few entities; `set(bytes)` fixes the buckets' budget and
    the modes that pass 2 gave the chunks are recorded (1 buffered, 2 mapped)."""
    monkeypatch.setattr(order, "_chunk_rows", lambda settings: 60)
    made: list[Buckets] = []
    chosen = {"budget": 0}

    def fixed(plan, chunks, num_columns, budget, files):
        made.append(Buckets(plan, chunks, num_columns, chosen["budget"], files))
        return made[-1]

    monkeypatch.setattr(write, "Buckets", fixed)

    def set_budget(budget: int) -> list[Buckets]:
        chosen["budget"] = budget
        made.clear()
        return made

    return set_budget


@pytest.mark.parametrize("scaling, nan", [("global", "ffill"), ("per-entity", "drop")])
def test_buffered_and_mapped_chunks_give_the_same_store(tmp_path, budgets, scaling, nan):
    panel = make_panel(seed=5, num_entities=50, times="mixed")
    a = panel["a"].to_numpy().copy()
    a[::13] = np.nan
    panel = panel.set_column(panel.schema.get_field_index("a"), "a", pa.array(a))
    src = write_files(panel, tmp_path / "src", num_files=3, seed=2)
    stores, modes = [], []
    # every chunk mapped, some of each, every chunk buffered; with 1 and 3 workers
    for budget, workers in ((0, 1), (6000, 1), (6000, 3), (1 << 30, 3)):
        made = budgets(budget)
        store = ingest(
            src, tmp_path / f"b{budget}-w{workers}", entity_col="entity", time_col="t",
            features=["a", "b"], targets=["y"], stratum_col="kind", scaling=scaling,
            nan=nan, batch_size=40, workers=workers, progress=False,
        )  # fmt: skip
        assert "order_s" in store.metadata["timings_s"]
        stores.append(_store_bytes(store.path))
        modes.append(set(made[-1].mode.tolist()))
        assert made[-1].held == 0  # pass 3 took every bucket
    assert all(found == stores[0] for found in stores[1:])
    assert modes[0] == {2} and modes[-1] == {1}
    assert modes[1] == {1, 2}  # the budget ran out part of the way


def test_a_chunk_mapped_for_want_of_budget_is_reserved_on_disk(tmp_path):
    """A chunk that finds the budget spent has its byte range reserved (whole pages) in
    both sparse store files before pass 2 writes it through the mapping; a buffered
    chunk reserves nothing and is handed over once."""
    plan = SimpleNamespace(starts=np.array([0, 4000, 9000]), lengths=np.array([4000, 5000, 3000]))
    chunks = [(0, 1), (1, 2), (2, 3)]
    fds = []
    for name, row_bytes in (("values", 12), ("times", 8)):
        fd = os.open(tmp_path / name, os.O_RDWR | os.O_CREAT)
        os.ftruncate(fd, 12000 * row_bytes)
        fds.append(fd)
    try:
        bucket_bytes = 4000 * (12 + 8 + 1)
        buckets = Buckets(plan, chunks, 3, bucket_bytes, (fds[0], fds[1]))
        assert [os.fstat(fd).st_blocks for fd in fds] == [0, 0]
        first, second = buckets.claim(np.array([0, 1]))
        assert first is not None and first.values.shape == (4000, 3) and second is None
        assert buckets.mode.tolist() == [1, 2, 0]
        for fd, row_bytes in zip(fds, (12, 8), strict=True):
            assert os.fstat(fd).st_blocks * 512 >= 5000 * row_bytes  # chunk 1 reserved
        assert buckets.claim(np.array([0]))[0] is first  # the same bucket again
        assert buckets.take(0) is first and buckets.held == 0
        assert buckets.take(1) is None
    finally:
        for fd in fds:
            os.close(fd)
