"""Hostile input to ingest and to stores on disk: one line naming what is wrong, never a
traceback, nothing lost or half-written (OUT as a link, times beyond int64, null index
cells, a damaged or swapped `entity_stats.npz`, the size a full disk is told about)."""

from __future__ import annotations

import datetime
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_panel import make_panel, write_files

from metadist.store import SeriesStore, ingest, sources
from metadist.store.finish import estimated_store_bytes
from metadist.store.format import ENTITY_STATS_FILE, INDEX_FILE, file_checksum
from metadist.store.input_files import resolve_paths
from metadist.store.verify import verify

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min
OPTIONS = dict(entity_col="entity", time_col="t", features=["a", "b"], targets=["y"])
CLI_OPTIONS = ["--entity-col", "entity", "--time-col", "t", "--features", "a,b"]


def _ingest(src, out, **options):
    return ingest(src, out, progress=False, **{**OPTIONS, **options})


def _cli(*argv: str, cwd: Path, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:  # writes past `limit_bytes` fail with EFBIG, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "metadist.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=limit if limit_bytes is not None else None,
    )


def _one_line_error(done: subprocess.CompletedProcess, *patterns: str) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-3000:]
    for pattern in patterns:
        assert pattern in lines[0], lines[0]
    return lines[0]


def _hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def panel_dir(tmp_path_factory) -> Path:
    return write_files(make_panel(seed=7, num_entities=12), tmp_path_factory.mktemp("src"))


@pytest.fixture(scope="module")
def store_path(tmp_path_factory, panel_dir) -> Path:
    out = tmp_path_factory.mktemp("store") / "store"
    _ingest(panel_dir, out, scaling="per-entity")
    return out


@pytest.fixture()
def copy(store_path, tmp_path) -> Path:
    return Path(shutil.copytree(store_path, tmp_path / "store"))


# ------------------------------------------------------------------ OUT is a link


def test_ingest_through_a_link_replaces_its_target_and_keeps_the_link(tmp_path, panel_dir):
    real = tmp_path / "data" / "store"
    real.parent.mkdir()
    _ingest(write_files(make_panel(seed=1, num_entities=5), tmp_path / "other"), real)
    link = tmp_path / "link"
    link.symlink_to(real)
    store = _ingest(panel_dir, link)
    assert link.is_symlink() and Path(os.readlink(link)) == real
    assert SeriesStore.open(real).num_entities == store.num_entities == 12
    assert _hidden(tmp_path) == [] and _hidden(real.parent) == []  # no temporaries left


def test_ingest_through_a_dangling_link_creates_its_target(tmp_path, panel_dir):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "made")
    _ingest(panel_dir, link)
    assert link.is_symlink() and SeriesStore.open(tmp_path / "made").num_entities == 12


def test_ingest_through_a_link_loop_is_one_line(tmp_path, panel_dir):
    link = tmp_path / "loop"
    link.symlink_to(link)
    done = _cli("ingest", str(panel_dir), str(link), *CLI_OPTIONS, cwd=tmp_path)
    _one_line_error(done, "metadist ingest: error:", f"{link} is a symbolic link loop")
    assert link.is_symlink() and os.readlink(link) == str(link)
    assert _hidden(tmp_path) == []


# ------------------------------------------------------------------ null index cells


@pytest.mark.parametrize("column", ["entity_id", "stratum"])
def test_a_null_in_the_entity_index_is_one_line_naming_file_row_and_column(copy, column):
    index = pa.ipc.open_file(pa.memory_map(str(copy / INDEX_FILE))).read_all()
    cells = index[column].to_pylist()
    cells[3] = None
    index = index.set_column(index.schema.get_field_index(column), column, pa.array(cells))
    with (
        pa.OSFile(str(copy / INDEX_FILE), "wb") as sink,
        pa.ipc.new_file(sink, index.schema) as writer,
    ):
        writer.write_table(index)
    with pytest.raises(ValueError) as caught:
        SeriesStore.open(copy)
    message = str(caught.value)
    assert f"{INDEX_FILE}: row 3: column {column!r} is null" in message and "\n" not in message


def test_a_null_entity_id_in_the_input_is_one_line_naming_file_and_row(tmp_path):
    table = pa.table(
        {
            "entity": pa.array(["e0"] * 4 + [None] + ["e1"] * 3),
            "t": pa.array([0, 1, 2, 3, 0, 1, 2, 3], pa.int64()),
            "a": np.arange(8.0),
            "b": np.arange(8.0),
            "y": np.arange(8.0),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    done = _cli("ingest", str(tmp_path / "in.parquet"), str(tmp_path / "out"), *CLI_OPTIONS,
                cwd=tmp_path)  # fmt: skip
    _one_line_error(done, "in.parquet: row 4: column 'entity' is null")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ times beyond int64


def _times_file(tmp_path, times: pa.Array, name: str = "in.parquet") -> Path:
    n = len(times)
    table = pa.table(
        {
            "entity": ["e0"] * n,
            "t": times,
            "a": np.arange(n, dtype=np.float32),
            "b": np.arange(n, dtype=np.float32),
        }
    )
    pq.write_table(table, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("order", ["decreasing", "increasing"])
def test_times_further_apart_than_int64_are_refused_not_wrapped(tmp_path, order):
    times = [INT64_MAX, INT64_MIN] if order == "decreasing" else [INT64_MIN, 0, INT64_MAX]
    src = _times_file(tmp_path, pa.array(times, pa.int64()))
    done = _cli("ingest", str(src), str(tmp_path / "out"), *CLI_OPTIONS, cwd=tmp_path)
    _one_line_error(done, "entity 'e0' has times from", "further apart than the int64 range")
    assert not (tmp_path / "out").exists() and _hidden(tmp_path) == []


def test_times_at_the_top_of_int64_are_kept_in_order(tmp_path):
    times = [INT64_MAX, INT64_MAX - 2, INT64_MAX - 1]
    store = ingest(
        _times_file(tmp_path, pa.array(times, pa.int64())), tmp_path / "out",
        entity_col="entity", time_col="t", features=["a", "b"], progress=False,
    )  # fmt: skip
    assert store.series_times(0).tolist() == sorted(times)
    verify(store.path)


@pytest.mark.parametrize(
    "times",
    [
        pa.array([0, INT64_MAX - 1], pa.timestamp("us")),
        pa.array([datetime.date(2000, 1, 1), datetime.date(9999, 1, 2)], pa.date32()),
    ],
    ids=["microseconds", "date"],
)
def test_timestamps_beyond_int64_nanoseconds_are_one_line(tmp_path, times):
    src = _times_file(tmp_path, times)
    done = _cli("ingest", str(src), str(tmp_path / "out"), *CLI_OPTIONS, cwd=tmp_path)
    _one_line_error(done, "in.parquet: row 1: time column 't' holds", "1677 to 2262")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ entity_stats.npz


def test_a_truncated_entity_stats_is_one_line_naming_the_file(copy):
    stats = copy / ENTITY_STATS_FILE
    stats.write_bytes(stats.read_bytes()[: stats.stat().st_size // 2])
    store = SeriesStore.open(copy)
    for read in (lambda: store.entity_stats, lambda: store.scaler):
        with pytest.raises(ValueError) as caught:
            read()
        message = str(caught.value)
        assert f"{stats} is unreadable" in message and "\n" not in message, message
    done = _cli("verify", str(copy), cwd=copy.parent)
    _one_line_error(done, "metadist verify: error:", "entity_stats.npz")


def test_a_valid_entity_stats_holding_other_numbers_fails_verify(copy, store_path):
    meta = SeriesStore.open(store_path).metadata
    assert set(meta["checksums"]) >= {INDEX_FILE, ENTITY_STATS_FILE}
    assert meta["checksums"][ENTITY_STATS_FILE] == file_checksum(store_path / ENTITY_STATS_FILE)
    stats = dict(np.load(copy / ENTITY_STATS_FILE))
    stats["mean"] = stats["mean"] + 1.0  # still four finite [E, C] arrays
    with open(copy / ENTITY_STATS_FILE, "wb") as handle:
        np.savez(handle, **stats)
    done = _cli("verify", str(copy), cwd=copy.parent)
    _one_line_error(done, "metadist verify: error:", "entity_stats.npz is corrupt (checksum")


def test_a_store_from_before_the_recorded_checksums_still_verifies(copy):
    meta_path = copy / "metadata.json"
    meta = json.loads(meta_path.read_text())
    for name in (INDEX_FILE, ENTITY_STATS_FILE):
        del meta["checksums"][name]
    del meta["metadata_checksum"]  # recorded later still
    meta_path.write_text(json.dumps(meta))
    assert verify(copy).num_entities == 12


# ------------------------------------------------------------------ the size told on a full disk


def _store_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir())


def _many_short_entities(tmp_path) -> Path:
    """20,000 entities of 5 rows: the index and the per-entity statistics outweigh the
    values and times (where an estimate of rows alone is a third of the store)."""
    num_entities, length = 20_000, 5
    rng = np.random.default_rng(0)
    n = num_entities * length
    table = pa.table(
        {
            "entity": np.repeat([f"sensor-{i:07d}" for i in range(num_entities)], length),
            "t": np.tile(np.arange(length, dtype=np.int64), num_entities),
            "a": rng.normal(size=n),
            "b": rng.normal(size=n),
            "y": rng.normal(size=n),
            "kind": np.repeat([f"kind{i % 4}" for i in range(num_entities)], length),
        }
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, tmp_path / "panel.parquet", row_group_size=10_000)
    return tmp_path / "panel.parquet"


@pytest.mark.parametrize("shape", ["many short entities", "few long entities"])
def test_the_size_estimate_covers_every_file_of_the_store(tmp_path, panel_dir, shape):
    if shape == "many short entities":
        src, stratum = _many_short_entities(tmp_path / "src"), "kind"
    else:
        table = make_panel(seed=3, num_entities=6, length_range=(3000, 4000))
        src, stratum = write_files(table, tmp_path / "src"), "kind"
    store = _ingest(src, tmp_path / "store", stratum_col=stratum, scaling="per-entity")
    columns = sources.Columns("entity", "t", ("a", "b"), ("y",), stratum, None)
    files, _ = sources.check_sources(sources.open_sources(resolve_paths(src)), columns)
    estimate, actual = estimated_store_bytes(files, columns), _store_size(store.path)
    assert 0.95 * actual <= estimate <= 1.2 * actual, (estimate, actual)


@pytest.mark.integration
def test_a_full_disk_is_told_the_size_of_the_whole_store(tmp_path):
    src = _many_short_entities(tmp_path / "src")
    argv = ["ingest", str(src), "OUT", *CLI_OPTIONS, "--targets", "y", "--stratum-col", "kind"]
    done = _cli(*[str(tmp_path / "store") if a == "OUT" else a for a in argv], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    actual = _store_size(tmp_path / "store")
    out = tmp_path / "full"
    done = _cli(*[str(out) if a == "OUT" else a for a in argv], cwd=tmp_path, limit_bytes=4096)
    line = _one_line_error(done, "no space to write the store at", str(out))
    told = re.search(r"about ([\d.,]+) (KB|MB)", line)
    assert told is not None, line
    told_bytes = float(told.group(1).replace(",", "")) * {"KB": 1e3, "MB": 1e6}[told.group(2)]
    assert 0.95 * actual <= told_bytes <= 1.2 * actual, (line, actual)
    assert not out.exists() and _hidden(tmp_path) == []
