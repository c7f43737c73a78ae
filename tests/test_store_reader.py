"""`SeriesStore.open` on good, damaged and foreign directories; the scaler."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from store_panel import make_panel, write_files

from metadist.store import Scaler, SeriesStore, ingest


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader")
    source = write_files(make_panel(seed=31, num_entities=8), root / "src")
    ingest(
        source, root / "store", entity_col="entity", time_col="t", features=["a", "b"],
        targets=["y"], scaling="per-entity", progress=False,
    )  # fmt: skip
    return root / "store"


def _copy(store_path, tmp_path):
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(store_path, target)
    return target


def test_open_and_index(store_path):
    store = SeriesStore.open(store_path)
    assert store.num_entities == 8 and store.num_rows == int(store.lengths.sum())
    assert list(store.stratum_names) == [""] and set(store.strata) == {""}
    with pytest.raises(IndexError):
        store.series(8)
    np.testing.assert_array_equal(store.series(-1), store.series(7))


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_store_imports_neither_torch_nor_pandas(store_path):
    code = (
        "import sys; from metadist.store import SeriesStore; "
        f"s = SeriesStore.open({str(store_path)!r}); s.series(0); s.strata; s.entity_ids; "
        "print('torch' in sys.modules, 'pandas' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False"], result.stderr


def test_missing_and_foreign_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SeriesStore.open(tmp_path / "nothing")
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a directory"):
        SeriesStore.open(tmp_path / "file.bin")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "data.csv").write_text("a,b\n")
    with pytest.raises(FileNotFoundError, match="not a series store: metadata.json is missing"):
        SeriesStore.open(tmp_path / "foreign")
    (tmp_path / "foreign" / "metadata.json").write_text('{"name": "something else"}')
    with pytest.raises(ValueError, match="not a series store"):
        SeriesStore.open(tmp_path / "foreign")
    (tmp_path / "foreign" / "metadata.json").write_text("{broken")
    with pytest.raises(ValueError, match="not valid JSON"):
        SeriesStore.open(tmp_path / "foreign")


def test_other_format_version(store_path, tmp_path):
    path = _copy(store_path, tmp_path)
    meta = json.loads((path / "metadata.json").read_text())
    meta["format_version"] = 99
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="version 99"):
        SeriesStore.open(path)


@pytest.mark.parametrize("name", ["values.bin", "times.bin"])
def test_truncated_file(store_path, tmp_path, name):
    path = _copy(store_path, tmp_path)
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[: len(data) - 12])
    meta = json.loads((path / "metadata.json").read_text())
    rows = meta["num_rows"]
    layout = (
        f"{rows} rows x {len(meta['column_names'])} columns x 4 bytes"
        if name == "values.bin"
        else f"{rows} rows x 8 bytes"
    )
    with pytest.raises(ValueError, match=f"{name} has {len(data) - 12} bytes") as caught:
        SeriesStore.open(path)
    assert f"needs {len(data)} ({layout}); the file is truncated" in str(caught.value)


@pytest.mark.parametrize("name", ["values.bin", "times.bin", "index.arrow"])
def test_missing_file(store_path, tmp_path, name):
    path = _copy(store_path, tmp_path)
    (path / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"{name} is missing"):
        SeriesStore.open(path)


def test_garbage_index(store_path, tmp_path):
    path = _copy(store_path, tmp_path)
    (path / "index.arrow").write_bytes(b"not arrow at all" * 10)
    with pytest.raises(ValueError, match="index.arrow is unreadable"):
        SeriesStore.open(path)


def test_lazy_reopen_after_pickle(store_path):
    import pickle

    store = SeriesStore.open(store_path)
    clone = pickle.loads(pickle.dumps(store))
    assert clone._mapped is None  # nothing mapped until first use
    np.testing.assert_array_equal(clone.series(3), store.series(3))
    assert list(clone.entity_ids) == list(store.entity_ids)


def test_a_store_replaced_at_its_path_is_refused_where_a_pickle_reopens_it(tmp_path):
    """A worker handed the store reopens its path: a store re-ingested there since (other
    data, same path) is refused, not read beside the parent's old one."""
    import pickle

    args = dict(entity_col="entity", time_col="t", features=["a", "b"], targets=["y"],
                scaling="per-entity", progress=False)  # fmt: skip
    ingest(
        write_files(make_panel(seed=1, num_entities=4), tmp_path / "one"), tmp_path / "s", **args
    )
    handed = pickle.dumps(SeriesStore.open(tmp_path / "s"))
    same = pickle.loads(handed)
    assert same.num_entities == 4  # the store it was handed: reopened as before
    ingest(
        write_files(make_panel(seed=2, num_entities=5), tmp_path / "two"), tmp_path / "s", **args
    )
    with pytest.raises(ValueError, match=r"store .*/s was replaced after this process was handed"):
        pickle.loads(handed).series(0)
    pickle.loads(pickle.dumps(SeriesStore(tmp_path / "s"))).series(0)  # never opened: no record


def test_scaler_global_round_trip_and_columns():
    scaler = Scaler("global", np.array([1.0, -2.0, 10.0]), np.array([2.0, 0.5, 4.0]))
    values = np.arange(12, dtype=np.float64).reshape(4, 3)
    scaled = scaler.transform(values)
    np.testing.assert_allclose(scaled, (values - [1.0, -2.0, 10.0]) / [2.0, 0.5, 4.0])
    np.testing.assert_allclose(scaler.inverse(scaled), values)
    target = values[:, [2]]
    np.testing.assert_allclose(
        scaler.inverse(scaler.transform(target, columns=[2]), columns=[2]), target
    )
    with pytest.raises(ValueError, match="selects 2 columns"):
        scaler.transform(target, columns=[0, 2])


def test_scaler_per_entity_broadcasts_entity_index():
    rng = np.random.default_rng(0)
    mean, std = rng.normal(size=(5, 3)), rng.uniform(0.5, 2, size=(5, 3))
    scaler = Scaler("per-entity", mean, std)
    values = rng.normal(size=(4, 6, 2))  # [B, H, T] of columns 1 and 2
    entity = np.array([[0], [3], [3], [4]])  # [B, 1] broadcast over H
    out = scaler.inverse(values, entity, columns=[1, 2])
    for b in range(4):
        e = entity[b, 0]
        np.testing.assert_allclose(out[b], values[b] * std[e, 1:] + mean[e, 1:])
    with pytest.raises(ValueError, match="entity_index"):
        scaler.inverse(values, columns=[1, 2])


def test_scaler_on_torch_tensors(store_path):
    torch = pytest.importorskip("torch")
    store = SeriesStore.open(store_path)
    series = torch.from_numpy(np.array(store.series(2)))
    restored = store.scaler.inverse(series, torch.tensor(2))
    assert isinstance(restored, torch.Tensor) and restored.dtype == torch.float32
    expected = store.scaler.inverse(np.array(store.series(2)), 2)
    np.testing.assert_allclose(restored.numpy(), expected, rtol=1e-6)
