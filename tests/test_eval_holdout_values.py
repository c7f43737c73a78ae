"""A holdout file's values are each series' truth: one finite value per time step."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadist.eval.holdout import read_holdout
from metadist.store import SeriesStore
from metadist.store.ingest import ingest


def _write(path, rows):
    names, times, values = zip(*rows, strict=True)
    pq.write_table(
        pa.table({"series_id": list(names), "t": list(times), "value": list(values)}), path
    )


@pytest.fixture
def store(tmp_path):
    _write(tmp_path / "train.parquet", [(n, t, 10.0 + t) for n in "AB" for t in range(20)])
    ingest(
        tmp_path / "train.parquet", tmp_path / "store", entity_col="series_id", time_col="t",
        features=["value"], scaling="none", progress=False,
    )  # fmt: skip
    return SeriesStore.open(tmp_path / "store")


def _read(path, store):
    return read_holdout(path, store, entity_col="series_id", time_col="t", value_cols=["value"])


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_a_holdout_value_that_is_not_finite_is_refused_naming_its_row(tmp_path, store, value):
    """An infinite truth made the task's sMAPE and MAPE NaN, and the task was left out of
    their means without a word; it is refused as NaN is."""
    path = tmp_path / "holdout.parquet"
    _write(path, [("A", 20, 1.0), ("A", 21, value), ("B", 20, 2.0)])
    with pytest.raises(ValueError, match=r"holdout .*: row 1 has a value that is not finite"):
        _read(path, store)


def test_two_holdout_rows_of_one_series_at_one_time_are_refused(tmp_path, store):
    """A repeated row was read as one more step of the horizon: that step scored twice."""
    path = tmp_path / "holdout.parquet"
    _write(path, [("A", 20, 1.0), ("B", 20, 2.0), ("A", 21, 3.0), ("A", 20, 1.5)])
    with pytest.raises(ValueError, match="entity 'A' has more than one row at t 20"):
        _read(path, store)
    _write(path, [("A", 20, 1.0), ("B", 20, 2.0), ("A", 21, 3.0)])
    holdout = _read(path, store)
    assert holdout[0][0].tolist() == [20, 21] and holdout[1][1][:, 0].tolist() == [2.0]


def test_nulls_other_types_and_other_files_are_named(tmp_path, store):
    """A null time was read as the time NaN and scored as one more step; a null id, a
    value or time that is not a number, and a file that is not Parquet were messages
    that did not name the holdout, its row or its column."""
    path = tmp_path / "holdout.parquet"
    columns = {"series_id": ["A", "A"], "t": [20, 21], "value": [1.0, 2.0]}
    cases = {
        "t": (pa.array([20, None], pa.int64()), r"row 1: column 't' is null"),
        "series_id": (pa.array([None, "A"], pa.string()), r"row 0: column 'series_id' is null"),
        "value": (pa.array(["x", "y"]), r"column 'value' must hold numbers, not string"),
    }
    for name, (column, message) in cases.items():
        pq.write_table(pa.table({**columns, name: column}), path)
        with pytest.raises(ValueError, match=rf"holdout {path}: {message}"):
            _read(path, store)
    pq.write_table(pa.table({**columns, "t": pa.array(["20", "21"])}), path)
    with pytest.raises(ValueError, match="column 't' must hold time steps"):
        _read(path, store)
    path.write_text("entity,t,value\n")
    with pytest.raises(ValueError, match=rf"{path} is not a readable Parquet file"):
        _read(path, store)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        # bool("false") is True: a holdout lacking entities was scored in part, unasked
        ({"partial": "false"}, "eval.holdout.partial must be true or false, got 'false'"),
        ({"value_cols": [1]}, "eval.holdout.value_cols must be a list of column names"),
        ({"time_col": ["t"]}, "eval.holdout.time_col must be a column name"),
        ({"path": 3}, "eval.holdout.path must be a file path, got 3"),
    ],
)
def test_a_holdout_spec_of_the_wrong_type_is_named(tmp_path, store, spec, message):
    from metadist.eval import EvalOptions
    from metadist.eval.parts import holdout_reader

    options = EvalOptions(split="all", holdout={"path": str(tmp_path / "h.parquet"), **spec})
    with pytest.raises(ValueError, match=message):
        holdout_reader(store, options)


def test_one_value_column_may_be_named_alone(tmp_path, store):
    """`value_cols: value` was read as the columns 'v', 'a', 'l', 'u', 'e'."""
    from metadist.eval import EvalOptions
    from metadist.eval.parts import holdout_reader

    path = tmp_path / "holdout.parquet"
    _write(path, [("A", 20, 1.0), ("B", 20, 2.0)])
    holdout = {"path": str(path), "entity_col": "series_id", "time_col": "t"}
    reader = holdout_reader(
        store, EvalOptions(split="all", holdout={**holdout, "value_cols": "value"})
    )
    assert reader.read(["ignored"])[1][1][:, 0].tolist() == [2.0]
