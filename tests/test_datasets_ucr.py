"""UCR/UEA `.ts` files → long-format Parquet → a store of whole-series few-shot episodes."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from metadist.cli import main as cli_main
from metadist.datasets.ucr import (
    MissingUCRDataError,
    available_ucr_sets,
    read_ts,
    ucr_ingest_args,
    ucr_table,
    write_ucr,
)

# Two dimensions, cases of different lengths, a missing value.
MULTIVARIATE = """# a comment
@problemName Tiny
@timeStamps false
@missing true
@univariate false
@dimensions 2
@equalLength false
@classLabel true up down
@data
1,2,3:4,5,6:up
7,?,9,10:11,12,13,14:down
0.5,1.5:2.5,3.5:up
"""


def test_read_ts_parses_variable_length_multivariate_cases(tmp_path):
    path = tmp_path / "Tiny_TRAIN.ts"
    path.write_text(MULTIVARIATE)
    ts = read_ts(path)
    assert ts.dimensions == 2 and ts.labels == ["up", "down", "up"]
    np.testing.assert_array_equal(ts.cases[0], [[1, 4], [2, 5], [3, 6]])
    np.testing.assert_array_equal(ts.cases[1][:, 1], [11, 12, 13, 14])
    assert np.isnan(ts.cases[1][1, 0]) and ts.cases[1][2, 0] == 9
    table = ucr_table("Tiny", {"train": ts, "test": ts})
    assert table.column_names == ["series", "t", "dim_0", "dim_1", "label", "part"]
    assert table.num_rows == 2 * (3 + 4 + 2)
    rows = table.slice(3, 4).to_pydict()  # the second case
    assert set(rows["series"]) == {"Tiny_train_00001"} and rows["t"] == [0, 1, 2, 3]
    assert rows["dim_1"] == [11, 12, 13, 14] and set(rows["label"]) == {"down"}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("@classLabel true a\n@data\n1,2:3:a\n", "dimensions differ in length"),
        ("@classLabel true a\n@data\n1,x,3:a\n", "Bad_TRAIN.ts:3: a value is not a number"),
        ("@classLabel false\n@data\n1,2:0.5\n", "not a classification set"),
        ("@timeStamps true\n@classLabel true a\n@data\n(0,1):a\n", "time-stamped"),
        ("@classLabel true a\n", "no @data section"),
    ],
)
def test_bad_ts_files_are_named(tmp_path, text, match):
    path = tmp_path / "Bad_TRAIN.ts"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_ts(path)


@pytest.fixture(scope="module")
def installed_sets():
    sets = available_ucr_sets()
    if not sets:
        pytest.skip("the `ucr` extra (sktime or aeon) is not installed")
    return sets


def test_a_real_set_becomes_a_store_of_whole_series_episodes(tmp_path, installed_sets, capsys):
    # JapaneseVowels: 12 dimensions, cases of 7..29 steps, 9 classes
    name = "JapaneseVowels" if "JapaneseVowels" in installed_sets else installed_sets[0]
    assert cli_main(["datasets", "ucr", name, str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert (
        f"wrote {tmp_path / 'out' / 'panel.parquet'}" in printed
        and "next: metadist ingest" in printed
    )
    # the recipes' default store is not where the ingest line puts it: the train line says so
    store = tmp_path / "out" / "store"
    assert f"next: metadist ingest {tmp_path / 'out' / 'panel.parquet'} {store} " in printed
    assert f"then: metadist train experiment=ucr_protonet data.store={store}" in printed
    table = pq.read_table(tmp_path / "out" / "panel.parquet")
    dims = [c for c in table.column_names if c.startswith("dim_")]
    from metadist.store import SeriesStore, ingest
    from metadist.tasks import build_task_sampler, derive_task_seeds

    ingest(
        tmp_path / "out" / "panel.parquet",
        tmp_path / "store",
        **ucr_ingest_args(len(dims)),
        progress=False,
    )
    store = SeriesStore.open(tmp_path / "store")
    assert store.num_entities == len(set(table.column("series").to_pylist()))
    sampler = build_task_sampler(
        "nway_kshot", store, num_ways=3, num_shots=2, num_query=1, lookback=None, resample_to=16
    )
    batch = sampler.sample(np.arange(4), derive_task_seeds(0, 0, np.arange(4)))
    assert tuple(batch.support.x.shape) == (4, 6, 16, len(dims))
    assert np.isfinite(batch.support.x.numpy()).all()
    # a second write refuses to replace the directory
    assert cli_main(["datasets", "ucr", name, str(tmp_path / "out")]) == 1
    assert "--overwrite" in capsys.readouterr().err


def test_a_set_that_is_not_installed_names_the_installed_ones(tmp_path, installed_sets):
    with pytest.raises(MissingUCRDataError, match="available: .*" + installed_sets[0]):
        write_ucr("NoSuchSet", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_list_holds_classification_sets_only_and_a_name_in_another_case_is_hinted(
    installed_sets,
):
    """A regression set (`@classLabel false`, e.g. Covid3Month where installed) is not
    listed, since it has no classes; a set named in another case gets "did you mean"."""
    from metadist.datasets.ucr import find_ucr_files, ucr_directories

    for data in ucr_directories():
        for train in data.glob("*/*_TRAIN.ts"):
            name = train.name[: -len("_TRAIN.ts")]
            if name in installed_sets:
                assert read_ts(train).labels  # it reads as a classification set
    name = installed_sets[0]
    with pytest.raises(MissingUCRDataError, match=rf"did you mean {name}\?"):
        find_ucr_files(name.lower() if name.lower() != name else name.upper())
