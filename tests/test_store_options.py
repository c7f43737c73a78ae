"""`ingest` options: NaN policies, --min-length, progress and summary."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_panel import columns_of, make_panel, write_files

from metadist import progress
from metadist.cli import main as cli_main
from metadist.store import ingest
from metadist.store.ingest import summary

COLUMNS = ["a", "b", "y"]


def _with_gaps(
    seed: int, num_entities: int = 15, num_nans: int = 40
) -> tuple[pa.Table, np.ndarray]:
    """A panel whose a/y columns have NaN, inf and nulls; one entity's `y` is all NaN."""
    panel = make_panel(seed=seed, num_entities=num_entities)
    rng = np.random.default_rng(seed)
    a = panel["a"].to_numpy().copy()
    y = panel["y"].to_numpy().astype(np.float64)
    a[rng.choice(len(a), num_nans, replace=False)] = np.nan
    a[rng.choice(len(a), 5, replace=False)] = np.inf
    entities = np.asarray(panel["entity"].to_pylist())
    y[entities == "ent007"] = np.nan
    mask = np.zeros(len(y), bool)
    mask[rng.choice(len(y), 10, replace=False)] = True
    panel = panel.set_column(2, "a", pa.array(a))
    panel = panel.set_column(4, "y", pa.array(y, mask=mask))
    return panel, entities


def _run(src, out, **options):
    return ingest(
        src,
        out,
        entity_col="entity",
        time_col="t",
        features=["a", "b"],
        targets=["y"],
        stratum_col="kind",
        progress=False,
        batch_size=40,
        **options,
    )


def _sorted_rows(panel: pa.Table, entities: np.ndarray, entity: str) -> np.ndarray:
    times = panel["t"].to_numpy()
    rows = np.flatnonzero(entities == entity)
    return rows[np.argsort(times[rows])]


# Few entities with gaps are filled one by one, many (most of them here) chunk-wise.
@pytest.mark.parametrize(("num_entities", "num_nans"), [(15, 40), (150, 1500)])
def test_nan_ffill(tmp_path, num_entities, num_nans):
    panel, entities = _with_gaps(21, num_entities, num_nans)
    src = write_files(panel, tmp_path / "src")
    store = _run(src, tmp_path / "store", nan="ffill")
    values = columns_of(panel, COLUMNS)  # nulls read as NaN
    keep = entities != "ent007"
    clean = np.where(np.isfinite(values), values, np.nan)[keep]
    mean, std = np.nanmean(clean, axis=0), np.nanstd(clean, axis=0)
    np.testing.assert_allclose(store.metadata["scaling"]["mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(store.metadata["scaling"]["std"], std, rtol=1e-6)
    assert "ent007" not in set(store.entity_ids)
    dropped = store.metadata["dropped"]
    assert dropped["entities"] == [
        {"entity_id": "ent007", "reason": "column 'y' has no finite value to fill from"}
    ]
    mean = np.asarray(store.metadata["scaling"]["mean"])
    std = np.asarray(store.metadata["scaling"]["std"])
    for i, entity in enumerate(store.entity_ids):
        original = values[_sorted_rows(panel, entities, entity)]
        filled = original.copy()
        for c in range(filled.shape[1]):
            finite = np.flatnonzero(np.isfinite(filled[:, c]))
            source = finite[
                np.clip(np.searchsorted(finite, np.arange(len(filled)), "right") - 1, 0, None)
            ]
            filled[:, c] = filled[source, c]
        np.testing.assert_array_equal(store.series(i), ((filled - mean) / std).astype(np.float32))
    assert np.isfinite(store.values).all()


def test_nan_drop(tmp_path):
    panel, entities = _with_gaps(22)
    src = write_files(panel, tmp_path / "src")
    store = _run(src, tmp_path / "store", nan="drop", scaling="none")
    values = columns_of(panel, COLUMNS)
    good = np.isfinite(values).all(axis=1)
    assert store.num_rows == int(good.sum())
    assert store.metadata["dropped"]["entities"] == [
        {"entity_id": "ent007", "reason": "every row has a NaN, inf or null value"}
    ]
    np.testing.assert_allclose(
        store.metadata["scaling"]["mean"], values[good].mean(axis=0), rtol=1e-6
    )
    for i, entity in enumerate(store.entity_ids):
        rows = _sorted_rows(panel, entities, entity)
        rows = rows[good[rows]]
        np.testing.assert_array_equal(store.series(i), values[rows].astype(np.float32))


def test_min_length_drops_short_entities(tmp_path):
    panel = make_panel(seed=23, num_entities=20, length_range=(5, 40))
    entities = np.asarray(panel["entity"].to_pylist())
    names, counts = np.unique(entities, return_counts=True)
    src = write_files(panel, tmp_path / "src")
    store = _run(src, tmp_path / "store", min_length=20)
    assert list(store.entity_ids) == sorted(names[counts >= 20])
    assert store.lengths.min() >= 20
    dropped = {d["entity_id"]: d["reason"] for d in store.metadata["dropped"]["entities"]}
    assert set(dropped) == set(names[counts < 20])
    name = next(iter(dropped))
    assert dropped[name] == f"{counts[names == name][0]} rows, fewer than --min-length 20"
    assert store.metadata["dropped"]["reasons"] == {"too short": len(dropped)}
    kept = np.isin(entities, names[counts >= 20])
    np.testing.assert_allclose(
        store.metadata["scaling"]["mean"], columns_of(panel, COLUMNS)[kept].mean(axis=0), rtol=1e-6
    )
    text = summary(store)
    assert f"dropped    {len(dropped)} entities" in text and name in text


def test_progress_only_when_asked_or_on_a_terminal(tmp_path, capfd):
    src = write_files(make_panel(seed=24, num_entities=5), tmp_path / "src")
    ingest(src, tmp_path / "quiet", entity_col="entity", time_col="t", features=["a"])
    assert capfd.readouterr().err == ""  # stderr is not a terminal under pytest
    ingest(src, tmp_path / "loud", entity_col="entity", time_col="t", features=["a"], progress=True)
    err = capfd.readouterr().err
    assert "pass 1 scan" in err and "pass 3 order" in err and "rows" in err


def test_progress_lines_off_a_terminal(tmp_path, capfd, monkeypatch):
    """Off a terminal (a batch job's log) a long ingest prints progress lines per pass: a
    line every `LINE_EVERY_S` seconds, here every update."""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    src = write_files(make_panel(seed=24, num_entities=5), tmp_path / "src")
    ingest(src, tmp_path / "logged", entity_col="entity", time_col="t", features=["a"])
    err = capfd.readouterr().err
    assert "pass 1 scan: " in err and "rows (" in err, err
    ingest(src, tmp_path / "quiet", entity_col="entity", time_col="t", features=["a"],
           progress=False)  # fmt: skip
    assert capfd.readouterr().err == ""


@pytest.mark.integration
def test_cli_ingest_prints_summary(tmp_path, capsys):
    panel = make_panel(seed=25, num_entities=9, num_strata=3)
    src = write_files(panel, tmp_path / "src")
    out = tmp_path / "store"
    argv = ["ingest", str(src), str(out), "--entity-col", "entity", "--time-col", "t"]
    argv += ["--features", "a,b", "--targets", "y", "--stratum-col", "kind"]
    argv += ["--scaling", "per-entity", "--min-length", "2", "--no-progress"]
    assert cli_main(argv) == 0
    text = capsys.readouterr().out
    assert "entities   9" in text and f"rows {panel.num_rows:,}" in text
    for stratum in ("kind0", "kind1", "kind2"):
        assert stratum in text
    assert "dropped    none" in text
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["scaling"]["kind"] == "per-entity" and meta["min_length"] == 2


def test_single_file_glob_and_directory_sources_agree(tmp_path):
    panel = make_panel(seed=26, num_entities=6)
    src = write_files(panel, tmp_path / "src", num_files=3)
    pq.write_table(panel, tmp_path / "all.parquet")
    by_dir = _run(src, tmp_path / "a")
    by_glob = _run(str(src / "part-*.parquet"), tmp_path / "b")
    by_file = _run(tmp_path / "all.parquet", tmp_path / "c")
    np.testing.assert_array_equal(np.asarray(by_dir.values), np.asarray(by_glob.values))
    np.testing.assert_array_equal(np.asarray(by_dir.values), np.asarray(by_file.values))
    assert by_dir.metadata["source"]["num_files"] == 3


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_cli_ingest_loads_only_its_own_modules(tmp_path):
    """`metadist ingest` imports neither torch, pandas nor the other commands' modules:
    the start-up is part of every ingest's wall time."""
    import subprocess
    import sys

    src = write_files(make_panel(seed=27, num_entities=4), tmp_path / "src")
    code = (
        "import sys; from metadist.cli import main\n"
        f"code = main(['ingest', {str(src)!r}, {str(tmp_path / 'store')!r}, '--entity-col',"
        " 'entity', '--time-col', 't', '--features', 'a', '--no-progress'])\n"
        "loaded = [m for m in ('torch', 'pandas', 'metadist.datasets.m3', 'metadist.api') if m in sys.modules]\n"
        "print('loaded:', loaded); sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded: []" in done.stdout, done.stdout[-500:]
