"""`metadist verify`: a full check that finds damage `SeriesStore.open` cannot see."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from store_panel import make_panel, write_files

from metadist.cli import main as cli_main
from metadist.store import ingest
from metadist.store.format import file_checksum
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
