"""What `metadist ingest` reads and accepts: a directory's `*.parquet` files only (not a
README, not a series store beside them, not OUT itself), a glob matching Spark-style
directories, option values in range, and numbers in messages as numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadist.store import ingest

COLUMNS = dict(entity_col="eid", time_col="t", features=["a"])
FLAGS = ["--entity-col", "eid", "--time-col", "t", "--features", "a", "--no-progress"]


def _panel(path: Path, entities: tuple[str, ...] = ("x", "y"), big: float | None = None) -> Path:
    """Five rows per entity; `big` as the third value of the first entity."""
    values = np.arange(5 * len(entities), dtype=np.float64)
    if big is not None:
        values[2] = big
    table = pa.table(
        {"eid": [e for e in entities for _ in range(5)], "t": list(range(5)) * len(entities)}
    ).append_column("a", pa.array(values))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def _metadist(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "metadist.cli", *argv]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def _error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("metadist ingest: error: "), done.stderr
    return lines[0]


def test_a_directory_is_read_for_its_parquet_files_only(tmp_path):
    src = tmp_path / "data"
    _panel(src / "one.parquet", ("x",))
    _panel(src / "part" / "two.snappy.parquet", ("y",))
    (src / "README.md").write_text("# the panel\n")
    (src / "part" / "_SUCCESS").write_text("")
    (src / "notes").write_text("not parquet either")
    # Parquet by other names: other suffixes, any case, Hive's files without one
    _panel(src / "three.PQ", ("z",))
    _panel(src / "four.parq", ("w",))
    _panel(src / "hive" / "000000_0", ("v",))
    (src / "one.parquet.bak").write_bytes((src / "one.parquet").read_bytes())  # a backup
    store = ingest(src, tmp_path / "store", progress=False, **COLUMNS)
    assert store.metadata["source"]["num_files"] == 5
    assert sorted(store.entity_ids.tolist()) == ["v", "w", "x", "y", "z"]


def test_a_store_inside_the_source_is_not_read(tmp_path):
    src = tmp_path / "data"
    _panel(src / "panel.parquet")
    ingest(src, src / "first", progress=False, **COLUMNS)
    (src / "first" / "extra.parquet").symlink_to(src / "panel.parquet")  # would double rows
    second = ingest(src, src / "second", progress=False, **COLUMNS)
    assert second.metadata["source"]["num_files"] == 1 and second.num_rows == 10


def test_a_directory_without_parquet_files_is_named(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "README.md").write_text("nothing here yet\n")
    line = _error(_metadist("ingest", str(tmp_path / "data"), str(tmp_path / "s"), *FLAGS))
    assert f"directory {tmp_path / 'data'} holds no Parquet files" in line, line


def test_out_equal_to_or_holding_src_is_refused(tmp_path):
    src = _panel(tmp_path / "panel.parquet")
    store = tmp_path / "store"
    ingest(src, store, progress=False, **COLUMNS)
    checksums = store.joinpath("metadata.json").read_bytes()
    line = _error(_metadist("ingest", str(store), str(store), *FLAGS))
    assert f"OUT {store} is the input SRC {store} or holds it" in line, line
    inside = _panel(store / "inputs" / "panel.parquet")  # a store holding the input
    line = _error(_metadist("ingest", str(inside.parent), str(store), *FLAGS))
    assert f"OUT {store} is the input SRC {inside.parent} or holds it" in line, line
    assert store.joinpath("metadata.json").read_bytes() == checksums


def test_a_glob_matching_directories_reads_their_parquet_files(tmp_path):
    _panel(tmp_path / "spark" / "a.parquet" / "part-00000-1.snappy.parquet", ("x",))
    _panel(tmp_path / "spark" / "b.parquet" / "part-00000-2.snappy.parquet", ("y",))
    (tmp_path / "spark" / "a.parquet" / "_SUCCESS").write_text("")
    store = ingest(str(tmp_path / "spark" / "*.parquet"), tmp_path / "s", progress=False, **COLUMNS)
    assert store.metadata["source"]["num_files"] == 2
    assert sorted(store.entity_ids.tolist()) == ["x", "y"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--batch-size", "9223372036854775807", "--batch-size must be between 1 and 16,777,216"),
        ("--batch-size", "0", "--batch-size must be between 1 and 16,777,216 (rows), not 0"),
        ("--workers", "99999999999999999999", "--workers must be between 1 and 256 (threads)"),
        ("--workers", "1000", "--workers must be between 1 and 256 (threads), not 1000"),
        ("--workers", "0", "--workers must be between 1 and 256"),
    ],
)
def test_an_option_out_of_range_is_one_line_naming_its_flag(tmp_path, flag, value, said):
    src = _panel(tmp_path / "panel.parquet")
    line = _error(_metadist("ingest", str(src), str(tmp_path / "s"), *FLAGS, flag, value))
    assert said in line, line
    assert not (tmp_path / "s").exists()


def test_the_bounds_themselves_are_accepted(tmp_path):
    src = _panel(tmp_path / "panel.parquet")
    store = ingest(src, tmp_path / "s", progress=False, batch_size=1 << 24, workers=256, **COLUMNS)
    assert store.num_rows == 10


def test_a_value_beyond_the_store_range_is_printed_as_a_number(tmp_path):
    src = _panel(tmp_path / "panel.parquet", big=1e200)
    with pytest.raises(ValueError, match=r"of entity 'x' is 1e\+200, beyond") as error:
        ingest(src, tmp_path / "s", progress=False, **COLUMNS)
    assert "np." not in str(error.value)
