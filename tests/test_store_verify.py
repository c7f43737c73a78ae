"""`metadist verify`: a full check that finds damage `SeriesStore.open` cannot see."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_panel import make_panel, write_files

from metadist import progress
from metadist.cli import main as cli_main
from metadist.store import SeriesStore, ingest
from metadist.store import verify as store_verify
from metadist.store.format import file_checksum, metadata_checksum
from metadist.store.verify import verify


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    source = write_files(make_panel(seed=41, num_entities=10), root / "src")
    ingest(source, root / "store", entity_col="entity", time_col="t", features=["a", "y"],
           progress=False)  # fmt: skip
    return root / "store"


@pytest.fixture()
def copy(store_path, tmp_path):
    target = tmp_path / "store"
    shutil.copytree(store_path, target)
    return target


def _reseal(path, name):
    """Updates the recorded checksum after a deliberate edit of `name`."""
    meta = json.loads((path / "metadata.json").read_text())
    meta["checksums"][name] = file_checksum(path / name)
    meta["metadata_checksum"] = metadata_checksum(meta)
    (path / "metadata.json").write_text(json.dumps(meta))


@pytest.mark.integration
def test_sound_store_passes(store_path, capsys):
    assert verify(store_path).num_entities == 10
    assert cli_main(["verify", str(store_path)]) == 0
    assert "ok (10 entities" in capsys.readouterr().out


@pytest.mark.integration
def test_flipped_byte_is_reported(copy, capsys):
    data = bytearray((copy / "values.bin").read_bytes())
    data[len(data) // 2] ^= 0x40
    (copy / "values.bin").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="values.bin is corrupt"):
        verify(copy)
    assert cli_main(["verify", str(copy)]) == 1
    assert "metadist verify: error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "old,new",
    [
        ('"kind": "global"', '"kind": "none"'),  # the scaling undone silently
        ('"time_kind": "int"', '"time_kind": "timestamp"'),
        ('"std": [\n      ', '"std": [\n      1e3, '),  # one scale too many
    ],
)
def test_a_changed_value_in_the_metadata_is_reported(copy, capsys, old, new):
    """A digit or word of `metadata.json` changed so that it still parses (the scaler's
    numbers, the scaling kind, the time kind) is damage that `verify` names."""
    path = copy / "metadata.json"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ValueError, match="metadata.json is corrupt"):
        verify(copy)
    assert cli_main(["verify", str(copy)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "metadata.json is corrupt" in err[0], err


def test_the_metadata_laid_out_anew_still_verifies(copy):
    """The checksum covers the fields, not their layout: the same metadata written
    compactly (a tool that rewrites JSON) passes."""
    path = copy / "metadata.json"
    path.write_text(json.dumps(json.loads(path.read_text())))
    assert verify(copy).num_entities == 10


def test_progress_lines_off_a_terminal(store_path, capfd, monkeypatch):
    """Off a terminal (a batch job's log) a long verify prints the MB it has read: a line
    every `LINE_EVERY_S` seconds, here every update; `progress=False` prints none."""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    verify(store_path)
    err = capfd.readouterr().err
    assert "verify: " in err and " MB (" in err, err
    verify(store_path, progress=False)
    assert capfd.readouterr().err == ""


def test_unsorted_times_are_reported(copy):
    times = np.fromfile(copy / "times.bin", dtype="<i8")
    times[[3, 4]] = times[[4, 3]]
    times.tofile(copy / "times.bin")
    _reseal(copy, "times.bin")
    with pytest.raises(ValueError, match="do not increase strictly"):
        verify(copy)


def test_non_finite_values_are_reported(copy):
    values = np.fromfile(copy / "values.bin", dtype="<f4")
    values[5] = np.nan
    values.tofile(copy / "values.bin")
    _reseal(copy, "values.bin")
    with pytest.raises(ValueError, match="non-finite value at row 2"):
        verify(copy)


def test_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError):
        verify(tmp_path / "absent")


class _Reads:
    """A store's memory map that records how many rows each read takes."""

    def __init__(self, array, sizes: list[int]) -> None:
        self.array, self.sizes = array, sizes

    def __getitem__(self, key):
        rows = self.array[key]
        self.sizes.append(len(rows))
        return rows


@pytest.fixture()
def long_entity(tmp_path):
    """A store of three entities, the middle one 50 rows long."""
    table = pa.table(
        {
            "e": ["a"] * 3 + ["b"] * 50 + ["c"] * 4,
            "t": [*range(3), *range(50), *range(4)],
            "v": np.arange(57, dtype=np.float64),
        }
    )
    pq.write_table(table, tmp_path / "panel.parquet")
    ingest(tmp_path / "panel.parquet", tmp_path / "store", entity_col="e", time_col="t",
           features=["v"], scaling="none", progress=False)  # fmt: skip
    return tmp_path / "store"


def _damage(path, name, dtype, change):
    array = np.fromfile(path / name, dtype=dtype)
    change(array)
    array.tofile(path / name)
    _reseal(path, name)


def _verdict(path) -> str:
    try:
        verify(path)
    except ValueError as error:
        return str(error)
    return "ok"


@pytest.mark.parametrize("chunk", [1, 2, 7, 16])
def test_a_long_entity_is_read_in_slices_of_the_chunk(long_entity, monkeypatch, chunk):
    sizes: list[int] = []
    times = SeriesStore.times
    monkeypatch.setattr(SeriesStore, "times", property(lambda s: _Reads(times.fget(s), sizes)))
    monkeypatch.setattr(store_verify, "_CHUNK_ROWS", chunk)
    assert verify(long_entity).num_rows == 57
    assert max(sizes) <= chunk + 1  # the slice, and the row before it


@pytest.mark.parametrize("row", [4, 7, 8, 14, 15, 16, 52])
def test_a_boundary_inside_an_entity_is_checked_as_any_row(long_entity, monkeypatch, row):
    """Times out of order or a NaN at `row` of the long entity `b` (rows 3..52), on each
    side of a slice boundary of 7 rows, are found and named as with one slice."""
    for name, dtype, change in [
        ("times.bin", "<i8", lambda a: a.__setitem__(row, a[row - 1])),
        ("values.bin", "<f4", lambda a: a.__setitem__(row, np.nan)),
    ]:
        damaged = long_entity.parent / f"damaged-{name}"
        shutil.copytree(long_entity, damaged)
        _damage(damaged, name, dtype, change)
        monkeypatch.setattr(store_verify, "_CHUNK_ROWS", 1 << 20)
        whole = _verdict(damaged)
        assert f"row {row}" in whole and "'b'" in whole, whole
        for chunk in (1, 2, 7):
            monkeypatch.setattr(store_verify, "_CHUNK_ROWS", chunk)
            assert _verdict(damaged) == whole
        shutil.rmtree(damaged)
