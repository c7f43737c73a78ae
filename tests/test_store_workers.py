"""`ingest` with several workers: the same store byte for byte as with one, the same
error as with one, and the in-place path for input that is already in store order."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_panel import make_panel, write_files

from metadist.store import ingest
from metadist.store import scan as scan_module
from metadist.store.format import METADATA_FILE, STORE_FILES
from metadist.store.settings import IngestSettings

FEATURES = ["a", "b", "y"]


def _ordered_panel(directory: Path, num_files: int = 3, nans: bool = False) -> Path:
    """Float32 panel in store order: entities in id order, each one's rows together and
    in time order, split over `num_files` files with small row groups."""
    rng = np.random.default_rng(3)
    parts = []
    for i in range(30):
        length = int(rng.integers(40, 160))
        step = int(rng.integers(1, 4))
        parts.append(
            {
                "entity": np.full(length, f"ent{i:03d}"),
                "t": 5 * i + step * np.arange(length, dtype=np.int64),
                "kind": np.full(length, f"kind{i % 3}"),
                **{
                    name: (rng.normal(i, 1 + j, length) * 10**j).astype(np.float32)
                    for j, name in enumerate(FEATURES)
                },
            }
        )
    columns = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    if nans:
        columns["b"][rng.choice(len(columns["b"]), 25, replace=False)] = np.nan
    table = pa.table(columns)
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, num_files + 1).astype(int)
    for k in range(num_files):
        part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
        pq.write_table(part, directory / f"part-{k}.parquet", row_group_size=301)
    return directory


def _ingest(src, out, workers, **options):
    options.setdefault("batch_size", 64)
    return ingest(
        src,
        out,
        entity_col="entity",
        time_col="t",
        features=FEATURES[:2],
        targets=FEATURES[2:],
        stratum_col="kind",
        workers=workers,
        progress=False,
        **options,
    )


def _store_bytes(path: Path) -> dict[str, bytes]:
    """Every store file's bytes; metadata without its creation time and timings (and
    its checksum, which covers them)."""
    found = {name: (path / name).read_bytes() for name in STORE_FILES if name != METADATA_FILE}
    meta = json.loads((path / METADATA_FILE).read_text())
    for key in ("created_at", "timings_s", "metadata_checksum"):  # the last covers the others
        meta.pop(key)
    meta["source"].pop("path")
    found[METADATA_FILE] = json.dumps(meta, sort_keys=True).encode()
    return found


@pytest.mark.parametrize(
    "scaling, nan", [("global", "error"), ("per-entity", "ffill"), ("none", "drop")]
)
def test_workers_give_identical_stores_on_shuffled_input(tmp_path, scaling, nan):
    panel = make_panel(seed=8, num_entities=60, times="mixed")
    if nan != "error":
        a = panel["a"].to_numpy().copy()
        a[::17] = np.nan
        panel = panel.set_column(panel.schema.get_field_index("a"), "a", pa.array(a))
    src = write_files(panel, tmp_path / "src", num_files=4, seed=1)
    stores = [  # the last with a budget so small that the workers wait on each other
        _store_bytes(
            _ingest(
                src, tmp_path / f"w{w}", w, scaling=scaling, nan=nan, memory_limit_mb=limit
            ).path
        )
        for w, limit in ((1, 256), (3, 256), (8, 1))
    ]
    assert stores[0] == stores[1] == stores[2]


@pytest.mark.parametrize("scaling, nan", [("global", "error"), ("per-entity", "ffill")])
def test_ordered_float32_input_is_scaled_in_place_and_exact(tmp_path, scaling, nan):
    src = _ordered_panel(tmp_path / "src", nans=nan == "ffill")
    one = _ingest(src, tmp_path / "w1", 1, scaling=scaling, nan=nan)
    many = _ingest(src, tmp_path / "w4", 4, scaling=scaling, nan=nan)
    assert _store_bytes(one.path) == _store_bytes(many.path)
    assert set(one.metadata["timings_s"]) == {"scan_s", "finish_s"}  # no second read
    table = pq.read_table(src)
    entities = np.asarray(table["entity"].to_pylist())
    original = np.stack([table[name].to_numpy().astype(np.float64) for name in FEATURES], 1)
    assert list(one.entity_ids) == sorted(set(entities.tolist()))
    np.testing.assert_array_equal(np.asarray(one.times), table["t"].to_numpy())
    if scaling == "global":
        mean = np.asarray(one.metadata["scaling"]["mean"])
        std = np.asarray(one.metadata["scaling"]["std"])
    else:
        rows = np.repeat(np.arange(one.num_entities), one.lengths)
        mean, std = one.entity_stats["mean"][rows], one.entity_stats["std"][rows]
    expected = ((original - mean) / std).astype(np.float32)
    if nan == "ffill":  # the fill copies the previous row's scaled value
        for row in np.flatnonzero(np.isnan(expected[:, 1])):
            expected[row, 1] = expected[row - 1, 1]
        assert np.isfinite(expected).all()
    np.testing.assert_array_equal(np.asarray(one.values), expected)


def test_almost_ordered_input_takes_the_general_path(tmp_path):
    """One row out of time order in the last file: the in-place copy is given up and
    the store is the same as from shuffled input."""
    src = _ordered_panel(tmp_path / "src")
    last = sorted(src.glob("*.parquet"))[-1]
    table = pq.read_table(last)
    swapped = np.arange(table.num_rows)
    swapped[[10, 11]] = swapped[[11, 10]]
    pq.write_table(table.take(swapped), last, row_group_size=301)
    store = _ingest(src, tmp_path / "out", 2)
    assert "order_s" in store.metadata["timings_s"]
    reference = pq.read_table(src)
    order = np.lexsort((reference["t"].to_numpy(), reference["entity"].to_numpy()))
    np.testing.assert_array_equal(np.asarray(store.times), reference["t"].to_numpy()[order])


def _bad_inputs(tmp_path: Path) -> Path:
    """Shuffled files with two faults in different files: a NaN early in the input and
    a stratum that changes within an entity later."""
    panel = make_panel(seed=4, num_entities=50)
    src = write_files(panel, tmp_path / "src", num_files=4, seed=6)
    files = sorted(src.glob("*.parquet"))
    for path, share, column, value in ((files[1], 4, "a", np.nan), (files[3], 2, "kind", "odd")):
        rows = pq.read_table(path).to_pylist()
        rows[len(rows) // share][column] = value
        schema = pq.read_schema(path)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=97)
    return src


@pytest.mark.parametrize("nan", ["error", "drop"])
def test_error_found_by_a_worker_is_the_one_worker_error(tmp_path, nan):
    src = _bad_inputs(tmp_path)
    messages = []
    for workers in (1, 4):
        out = tmp_path / f"out{workers}"
        with pytest.raises(ValueError) as caught:
            _ingest(src, out, workers, nan=nan)
        messages.append(str(caught.value))
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".out{workers}")]
    assert messages[0] == messages[1]
    expected = "part-1.parquet: row" if nan == "error" else "part-3.parquet: row"
    assert expected in messages[0]


def test_workers_must_be_positive(tmp_path):
    src = _ordered_panel(tmp_path / "src")
    with pytest.raises(ValueError, match=r"--workers must be between 1 and \d+ \(threads\), not 0"):
        _ingest(src, tmp_path / "out", 0)


@pytest.mark.parametrize("scaling", ["per-entity", "global", "none"])
def test_in_place_store_equals_three_pass_store(tmp_path, monkeypatch, scaling):
    """The same ordered input with the raw copy turned off takes passes 2 and 3 (which
    keep float32 columns float32 and scale in float64): the store bytes are the same."""
    src = _ordered_panel(tmp_path / "src", nans=True)
    options = dict(scaling=scaling, nan="ffill")
    in_place = _ingest(src, tmp_path / "in-place", 2, **options)
    make = IngestSettings.of.__func__

    def without_raw_copy(cls, *args, **kwargs):
        return dataclasses.replace(make(cls, *args, **kwargs), float32_values=False)

    monkeypatch.setattr(IngestSettings, "of", classmethod(without_raw_copy))
    three_pass = _ingest(src, tmp_path / "three-pass", 2, **options)
    assert "finish_s" in in_place.metadata["timings_s"]
    assert "order_s" in three_pass.metadata["timings_s"]
    assert _store_bytes(in_place.path) == _store_bytes(three_pass.path)


def _dealt_panel(directory: Path, num_files: int = 4, duplicate: bool = False) -> Path:
    """Float64 panel whose rows are dealt among the files side by side (file k holds
    times k, k + num_files, ... of every entity; entities in id order; small row
    groups), as Spark or Dask write: the store fills region by region. Some entities
    have gaps (NaN) and irregular times; with `duplicate`, an early entity has two rows
    at one time."""
    rng = np.random.default_rng(5)
    per_file: list[list[dict]] = [[] for _ in range(num_files)]
    for i in range(40):
        length = num_files * int(rng.integers(5, 30))
        times = np.arange(length, dtype=np.int64) * (1 + i % 3)
        if i % 7 == 3:  # irregular: not a progression
            times = np.cumsum(rng.integers(1, 4, length))
        values = {name: rng.normal(i, 1 + j, length) for j, name in enumerate(FEATURES)}
        if i % 5 == 1:
            values["a"][rng.choice(length, 3, replace=False)] = np.nan
        for k in range(num_files):
            part = {
                "entity": np.full(length // num_files, f"ent{i:03d}"),
                "t": times[k::num_files].copy(),
                "kind": np.full(length // num_files, f"kind{i % 3}"),
                **{name: column[k::num_files] for name, column in values.items()},
            }
            if duplicate and i == 2 and k == 1:
                part["t"][1] = part["t"][0]
            per_file[k].append(part)
    directory.mkdir(parents=True, exist_ok=True)
    for k, parts in enumerate(per_file):
        columns = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
        pq.write_table(pa.table(columns), directory / f"part-{k}.parquet", row_group_size=50)
    return directory


@pytest.fixture
def small_chunks(monkeypatch):
    """Pass 3 in chunks of a few entities, and a record of what pass 2 finished early."""
    from metadist.store import order

    monkeypatch.setattr(order, "_chunk_rows", lambda settings: 60)
    finished: list[tuple[int, int, BaseException | None]] = []
    stop = order.EarlyFinisher.stop

    def recording_stop(self):
        # let the thread take every chunk that is ready (on a busy machine it may not
        # have taken any by the end of pass 2), so that what it did is certain
        deadline = time.monotonic() + 60
        while self.error is None and self.done < self.ready and time.monotonic() < deadline:
            time.sleep(0.005)
        stop(self)
        finished.append((self.done, len(self.chunks), self.error))

    monkeypatch.setattr(order.EarlyFinisher, "stop", recording_stop)
    return finished


@pytest.mark.parametrize("scaling, nan", [("global", "ffill"), ("per-entity", "drop")])
def test_regions_finished_during_pass_2_give_the_same_store(tmp_path, small_chunks, scaling, nan):
    src = _dealt_panel(tmp_path / "src")
    stores = []
    for workers, limit in ((1, 256), (2, 256), (3, 1)):
        store = _ingest(
            src, tmp_path / f"w{workers}", workers, scaling=scaling, nan=nan, batch_size=32,
            memory_limit_mb=limit,
        )  # fmt: skip
        assert "order_s" in store.metadata["timings_s"]
        stores.append(_store_bytes(store.path))
    assert stores[0] == stores[1] == stores[2]
    # one worker finishes nothing early; with more, every region is complete at the
    # end of pass 2 and is finished by the early finisher
    assert len(small_chunks) == 2
    for done, num_chunks, error in small_chunks:
        assert error is None
        assert done == num_chunks > 5


def test_a_duplicate_found_during_pass_2_is_the_one_worker_error(tmp_path, small_chunks):
    src = _dealt_panel(tmp_path / "src", duplicate=True)
    messages = []
    for workers in (1, 3):
        out = tmp_path / f"out{workers}"
        with pytest.raises(ValueError) as caught:
            _ingest(src, out, workers, nan="ffill", batch_size=32)
        messages.append(str(caught.value))
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".out{workers}")]
    assert messages[0] == messages[1]
    assert "duplicate (entity, time): entity 'ent002'" in messages[0]
    assert "part-1.parquet row" in messages[0]
    [(done, _, error)] = small_chunks  # found by the early finisher, raised by pass 3
    assert isinstance(error, ValueError) and str(error) == messages[1]


@pytest.mark.parametrize("nan", ["ffill", "drop"])  # the panel has NaN values
def test_a_dictionary_listing_absent_entities_gives_the_plain_store(tmp_path, nan):
    """A column written from a categorical keeps its whole category list in every row
    group, entities without a row included: they are no entities of the store (not
    stored empty, not reported dropped), and the store is the one of plain strings."""
    src = _dealt_panel(tmp_path / "plain")
    categorical = tmp_path / "categorical"
    categorical.mkdir()
    categories = pa.array([f"ent{i:03d}" for i in range(-3, 45)])  # 8 without rows
    for path in sorted(src.glob("*.parquet")):
        table = pq.read_table(path)
        codes = pa.compute.index_in(table.column("entity"), value_set=categories)
        entity = pa.DictionaryArray.from_arrays(codes.combine_chunks(), categories)
        table = table.set_column(table.schema.get_field_index("entity"), "entity", entity)
        pq.write_table(table, categorical / path.name, row_group_size=50)
    stores = [
        _ingest(path, tmp_path / f"out-{path.name}", 2, nan=nan, batch_size=32)
        for path in (src, categorical)
    ]
    assert stores[1].metadata["dropped"]["num_entities"] == 0
    assert stores[1].num_entities == stores[0].num_entities == 40
    for name in ("values.bin", "times.bin", "index.arrow", "entity_stats.npz"):
        assert (stores[0].path / name).read_bytes() == (stores[1].path / name).read_bytes()


def _count_overlaps(monkeypatch) -> dict[str, int]:
    """Patches pass 1's per-batch work and its merges to record how many ran at once
    (each sleeps a little, so that unserialised threads would overlap)."""
    seen = {"now": 0, "most": 0, "batches": 0, "merges": 0}
    lock = threading.Lock()

    def counted(original, key):
        def run(self, *args):
            with lock:
                seen["now"] += 1
                seen["most"] = max(seen["most"], seen["now"])
                seen[key] += 1
            try:
                time.sleep(0.002)
                return original(self, *args)
            finally:
                with lock:
                    seen["now"] -= 1

        return run

    scanner = scan_module._Scanner
    monkeypatch.setattr(scanner, "scan_batch", counted(scanner.scan_batch, "batches"))
    monkeypatch.setattr(scanner, "merge", counted(scanner.merge, "merges"))
    return seen


@pytest.mark.parametrize("cores_limit, serialised", [(10**6, True), (0, False)])
def test_pass_1_batch_work_runs_one_worker_at_a_time_on_few_cores(
    tmp_path, monkeypatch, cores_limit, serialised
):
    # The process's cores at most SERIAL_BATCH_WORK_CPUS (forced either way here):
    # one worker's numpy work at a time; beyond it, side by side. The same store both ways.
    panel = make_panel(seed=5, num_entities=50)
    src = write_files(panel, tmp_path / "src", num_files=4, seed=2)
    one = _store_bytes(_ingest(src, tmp_path / "w1", 1).path)
    monkeypatch.setattr(scan_module, "SERIAL_BATCH_WORK_CPUS", cores_limit)
    seen = _count_overlaps(monkeypatch)
    many = _store_bytes(_ingest(src, tmp_path / "w4", 4).path)
    assert many == one
    assert seen["batches"] == seen["merges"] > 8
    assert (seen["most"] == 1) == serialised


def test_pass_1_batches_that_copy_raw_rows_run_in_parallel(tmp_path, monkeypatch):
    src = _ordered_panel(tmp_path / "src", num_files=4)
    seen = _count_overlaps(monkeypatch)
    store = _ingest(src, tmp_path / "w4", 4)
    assert set(store.metadata["timings_s"]) == {"scan_s", "finish_s"}  # copied raw
    assert seen["most"] > 1
