"""Files of one input that differ only where the ingest does not look: the order of their
columns, columns it does not read, files without rows (pandas writes an empty frame's
columns as type `null`), features and targets of another numeric type (pandas writes an
integer column with a missing value as floats), times of another width, unit or zone
(Spark writes microseconds, pandas nanoseconds). The store is byte for byte the one the same files give
without those differences."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from store_panel import make_panel, write_files

from metadist.cli import main as cli_main
from metadist.store import SeriesStore, ingest

OPTIONS = dict(entity_col="entity", time_col="t", features=["a", "b"], targets=["y"])


@pytest.fixture()
def panel() -> pa.Table:
    return make_panel(seed=8, num_entities=9)


def _ingest(src, out) -> SeriesStore:
    return ingest(src, out, progress=False, batch_size=64, stratum_col="kind", **OPTIONS)


def _assert_same_store(got: SeriesStore, expected: SeriesStore) -> None:
    np.testing.assert_array_equal(np.asarray(got.values), np.asarray(expected.values))
    np.testing.assert_array_equal(np.asarray(got.times), np.asarray(expected.times))
    assert list(got.entity_ids) == list(expected.entity_ids)
    assert list(got.strata) == list(expected.strata)
    assert got.metadata["scaling"] == expected.metadata["scaling"]


def test_column_order_and_unread_columns_may_differ(tmp_path, panel):
    plain = write_files(panel, tmp_path / "plain", num_files=3)
    src = write_files(panel, tmp_path / "src", num_files=3)
    part = pq.read_table(src / "part-1.parquet")
    pq.write_table(part.select(part.column_names[::-1]), src / "part-1.parquet")
    part = pq.read_table(src / "part-2.parquet").drop_columns(["cls"])
    pq.write_table(part.append_column("note", pa.array(["x"] * part.num_rows)),
                   src / "part-2.parquet")  # fmt: skip
    expected = _ingest(plain, tmp_path / "expected")
    _assert_same_store(_ingest(src, tmp_path / "store"), expected)


def test_features_and_targets_may_be_numbers_of_other_types(tmp_path, panel):
    """`b` (int32) as float64 in one file, `y` (float32) as float64 in another: the same
    numbers, the same store."""
    plain = write_files(panel, tmp_path / "plain", num_files=3)
    src = write_files(panel, tmp_path / "src", num_files=3)
    for k, name in [(1, "b"), (2, "y")]:
        part = pq.read_table(src / f"part-{k}.parquet")
        index = part.schema.get_field_index(name)
        pq.write_table(part.set_column(index, name, part[name].cast(pa.float64())),
                       src / f"part-{k}.parquet")  # fmt: skip
    expected = _ingest(plain, tmp_path / "expected")
    _assert_same_store(_ingest(src, tmp_path / "store"), expected)


def _with_times(table: pa.Table, kind: pa.DataType) -> pa.Table:
    """`table` with its integer times `t` as hours of type `kind`."""
    hours = pc.multiply(table["t"], 3_600_000_000_000).cast(pa.timestamp("ns"))
    hours = hours if pa.types.is_timestamp(kind) else table["t"]
    return table.set_column(table.schema.get_field_index("t"), "t", hours.cast(kind))


def _retyped(src, part: int, kind: pa.DataType) -> None:
    """Rewrites file `part` of `src` with its times `t` cast to `kind`."""
    path = src / f"part-{part}.parquet"
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.schema.get_field_index("t"), "t", table["t"].cast(kind)),
                   path)  # fmt: skip


@pytest.mark.parametrize(
    "first,others",
    [
        (pa.int64(), [pa.int32(), pa.uint16()]),
        (pa.timestamp("ns"), [pa.timestamp("us"), pa.timestamp("ms")]),
        (pa.timestamp("ns", tz="UTC"), [pa.timestamp("us", tz="Europe/Berlin"),
                                        pa.timestamp("ms", tz="UTC")]),
    ],
    ids=["integers", "local timestamps", "instants"],
)  # fmt: skip
def test_times_of_one_family_may_differ_in_width_unit_or_zone(tmp_path, panel, first, others):
    table = _with_times(panel, first)  # times from 0 on
    plain = write_files(table, tmp_path / "plain", num_files=3)
    src = write_files(table, tmp_path / "src", num_files=3)
    for part, kind in enumerate(others, start=1):
        _retyped(src, part, kind)
    expected = _ingest(plain, tmp_path / "expected")
    _assert_same_store(_ingest(src, tmp_path / "store"), expected)


def test_local_times_beside_instants_are_refused(tmp_path, panel):
    """Timestamps without a zone in one file, with one in another: which instant a local
    time means is not known."""
    src = write_files(_with_times(panel, pa.timestamp("ns", tz="UTC")), tmp_path / "src")
    _retyped(src, 2, pa.timestamp("ns"))
    with pytest.raises(ValueError, match="column 't' is timestamp.ns. there but timestamp"):
        _ingest(src, tmp_path / "store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_files_without_rows_are_not_compared(tmp_path, panel):
    """An empty file typed `null` throughout, sorted first, and one lacking columns."""
    plain = write_files(panel, tmp_path / "plain", num_files=2)
    src = write_files(panel, tmp_path / "src", num_files=2)
    nulls = pa.table({name: pa.array([], pa.null()) for name in panel.column_names})
    pq.write_table(nulls, src / "empty-first.parquet")
    pq.write_table(panel.slice(0, 0).drop_columns(["a"]), src / "part-9.parquet")
    expected = _ingest(plain, tmp_path / "expected")
    store = _ingest(src, tmp_path / "store")
    _assert_same_store(store, expected)
    assert store.metadata["source"]["num_files"] == 4


def test_input_without_rows_is_named_as_empty(tmp_path, panel, capsys):
    nulls = pa.table({name: pa.array([], pa.null()) for name in panel.column_names})
    pq.write_table(nulls, tmp_path / "empty.parquet")
    argv = ["ingest", str(tmp_path / "empty.parquet"), str(tmp_path / "store")]
    argv += ["--entity-col", "entity", "--time-col", "t", "--features", "a", "--no-progress"]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"metadist ingest: error: empty input: {tmp_path / 'empty.parquet'} has no rows"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.parquet"]
