"""Round trip of `ingest`: shuffled multi-file Parquet in, exact scaled values out."""

from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_panel import columns_of, make_panel, write_files

from metadist.store import SeriesStore, ingest

FEATURES = ["a", "b"]
TARGETS = ["y"]
COLUMNS = ["a", "b", "y"]


@pytest.fixture(scope="module")
def panel() -> pa.Table:
    return make_panel(seed=1)


@pytest.fixture(scope="module")
def source(tmp_path_factory, panel) -> str:
    return str(write_files(panel, tmp_path_factory.mktemp("src"), num_files=4, seed=2))


def _ingest(source, out, **options) -> SeriesStore:
    options.setdefault("batch_size", 50)
    return ingest(
        source,
        out,
        entity_col="entity",
        time_col="t",
        features=FEATURES,
        targets=TARGETS,
        stratum_col="kind",
        label_col="cls",
        progress=False,
        **options,
    )


def _expected(panel: pa.Table):
    """Per entity id: (time-sorted times, `[L, C]` original values), computed directly."""
    entities = np.asarray(panel["entity"].to_pylist())
    times = panel["t"].to_numpy()
    values = columns_of(panel, COLUMNS)
    out = {}
    for entity in np.unique(entities):
        rows = np.flatnonzero(entities == entity)
        rows = rows[np.argsort(times[rows])]
        out[str(entity)] = (times[rows], values[rows])
    return out


@pytest.mark.parametrize("scaling", ["global", "per-entity", "none"])
def test_round_trip_values_exact(tmp_path, panel, source, scaling):
    store = _ingest(source, tmp_path / "store", scaling=scaling)
    expected = _expected(panel)
    assert store.num_entities == len(expected)
    assert store.num_rows == panel.num_rows
    assert store.column_names == COLUMNS
    assert store.feature_names == FEATURES and store.target_names == TARGETS
    assert list(store.entity_ids) == sorted(expected)
    all_values = columns_of(panel, COLUMNS)
    global_mean, global_std = all_values.mean(axis=0), all_values.std(axis=0)
    for i, entity in enumerate(store.entity_ids):
        times, original = expected[entity]
        if scaling == "global":
            mean = np.asarray(store.metadata["scaling"]["mean"])
            std = np.asarray(store.metadata["scaling"]["std"])
        elif scaling == "per-entity":
            mean, std = original.mean(axis=0), original.std(axis=0)
            np.testing.assert_allclose(store.entity_stats["mean"][i], mean, rtol=1e-6)
            mean, std = store.entity_stats["mean"][i], store.entity_stats["std"][i]
        else:
            mean, std = 0.0, 1.0
        want = ((original - mean) / std).astype(np.float32)
        np.testing.assert_array_equal(store.series(i), want)
        np.testing.assert_array_equal(store.series_times(i), times)
        np.testing.assert_allclose(
            store.scaler.inverse(store.series(i).astype(np.float64), i),
            original,
            rtol=1e-5,
            atol=1e-6 * np.abs(original).max(),
        )
    stats = store.metadata["scaling"]
    np.testing.assert_allclose(stats["mean"], global_mean, rtol=1e-6)
    np.testing.assert_allclose(stats["std"], global_std, rtol=1e-6)
    np.testing.assert_allclose(
        stats["m2"], ((all_values - global_mean) ** 2).sum(axis=0), rtol=1e-6
    )
    assert stats["count"] == [panel.num_rows] * 3


def test_per_entity_statistics_match_numpy(tmp_path, panel, source):
    store = _ingest(source, tmp_path / "store", scaling="per-entity")
    expected = _expected(panel)
    for i, entity in enumerate(store.entity_ids):
        original = expected[entity][1]
        np.testing.assert_array_equal(store.entity_stats["count"][i], len(original))
        np.testing.assert_allclose(store.entity_stats["mean"][i], original.mean(axis=0), rtol=1e-6)
        np.testing.assert_allclose(
            store.entity_stats["m2"][i],
            ((original - original.mean(axis=0)) ** 2).sum(axis=0),
            rtol=1e-6,
            atol=1e-9,
        )


def test_index_strata_labels_and_layout(tmp_path, panel, source):
    store = _ingest(source, tmp_path / "store")
    entities = np.asarray(panel["entity"].to_pylist())
    kinds = np.asarray(panel["kind"].to_pylist())
    classes = panel["cls"].to_numpy()
    for i, entity in enumerate(store.entity_ids):
        row = np.flatnonzero(entities == entity)[0]
        assert store.strata[i] == kinds[row]
        assert store.labels[i] == str(classes[row])
    assert list(store.stratum_names) == ["kind0", "kind1", "kind2"]
    np.testing.assert_array_equal(store.stratum_names[store.stratum_codes], store.strata)
    np.testing.assert_array_equal(store.label_names[store.label_codes], store.labels)
    assert store.starts[0] == 0
    np.testing.assert_array_equal(store.starts[1:], np.cumsum(store.lengths)[:-1])
    assert store.values.shape == (store.num_rows, 3) and store.values.dtype == np.float32
    assert not store.values.flags.writeable
    series = store.series(5)
    assert np.shares_memory(series, store.values)
    strata = store.metadata["strata"]
    assert sum(entry["entities"] for entry in strata.values()) == store.num_entities
    for name, entry in strata.items():  # entities and rows of each, in store order
        mine = store.strata == name
        assert entry == {"entities": int(mine.sum()), "rows": int(store.lengths[mine].sum())}
    first_seen = list(dict.fromkeys(store.strata.tolist()))
    assert list(strata) == first_seen
    assert store.column_index(["y", "a"]) == [2, 0]
    with pytest.raises(ValueError, match="'nope'"):
        store.column_index("nope")


@pytest.mark.parametrize("times", ["steps", "strided", "mixed"])
def test_round_trip_for_every_kind_of_time_axis(tmp_path, times):
    """Regular series are placed directly, the others sorted; both must come out exact."""
    panel = make_panel(seed=7, num_entities=24, length_range=(3, 40), times=times)
    source = write_files(panel, tmp_path / "src", num_files=3)
    store = _ingest(source, tmp_path / "store", scaling="none", batch_size=37)
    expected = _expected(panel)
    for i, entity in enumerate(store.entity_ids):
        np.testing.assert_array_equal(store.series_times(i), expected[entity][0])
        np.testing.assert_array_equal(store.series(i), expected[entity][1].astype(np.float32))


@pytest.mark.parametrize("times", ["steps", "gaps"])
def test_duplicate_time_is_found_in_placed_and_sorted_series(tmp_path, times):
    panel = make_panel(seed=8, num_entities=10, length_range=(20, 30), times=times)
    rows = panel.to_pylist()
    entity = rows[0]["entity"]
    when = sorted(r["t"] for r in rows if r["entity"] == entity)
    if times == "steps":
        # Drop the second time and repeat the third: the row count still fits a
        # progression, so the entity is placed directly and the repeat leaves a hole.
        rows = [r for r in rows if not (r["entity"] == entity and r["t"] == when[1])]
    source = write_files(pa.Table.from_pylist(rows, schema=panel.schema), tmp_path / "src", 2)
    repeat = next(r for r in rows if r["entity"] == entity and r["t"] == when[2])
    pq.write_table(pa.Table.from_pylist([repeat], schema=panel.schema), source / "y.parquet")
    with pytest.raises(ValueError, match=f"duplicate.*'{entity}'.*t = {when[2]}.*y.parquet row 0"):
        _ingest(source, tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_timestamp_time_column_and_integer_entities(tmp_path):
    rng = np.random.default_rng(3)
    num = 60
    entity = rng.integers(0, 4, num)
    day = np.zeros(num, np.int64)
    for e in range(4):
        rows = np.flatnonzero(entity == e)
        day[rows] = rng.permutation(len(rows))
    table = pa.table(
        {
            "id": entity,
            "when": pa.array(day.astype("datetime64[D]").astype("datetime64[ms]")),
            "x": rng.normal(size=num),
        }
    )
    pq.write_table(table, tmp_path / "one.parquet")
    store = ingest(
        tmp_path / "one.parquet",
        tmp_path / "store",
        entity_col="id",
        time_col="when",
        features=["x"],
        progress=False,
    )
    assert store.metadata["time_kind"] == "timestamp"
    assert list(store.entity_ids) == ["0", "1", "2", "3"]
    for i in range(4):
        times = store.series_times(i)
        want = np.arange(len(times)) * 86_400 * 10**9
        np.testing.assert_array_equal(times, want)


def test_replaces_existing_store(tmp_path, panel, source):
    out = tmp_path / "store"
    _ingest(source, out, scaling="none")
    store = _ingest(source, out, scaling="global")
    assert store.metadata["scaling"]["kind"] == "global"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def _read_in_child(store: SeriesStore, queue) -> None:
    queue.put([np.asarray(store.series(i)).copy() for i in range(store.num_entities)])


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_pickled_store_reads_same_values_in_spawned_process(tmp_path, source):
    store = _ingest(source, tmp_path / "store")
    assert len(pickle.dumps(store)) < 200 + len(str(store.path))
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(store, queue))
    child.start()
    received = queue.get(timeout=100)
    child.join(timeout=20)
    assert child.exitcode == 0
    for i, series in enumerate(received):
        np.testing.assert_array_equal(series, store.series(i))


def test_string_arrays_of_any_text_round_trip():
    from metadist.store.arrow import string_array

    for values in (["e1", "entity_22", ""], ["é", "ab", "日本", ""], []):
        array = string_array(values)
        assert array.type == pa.string() and array.to_pylist() == values
