"""`Run.classify` applies the store's NaN rule to new examples, as ingest applied it to
the store's cases, and names the first bad value it refuses by argument, column and row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tiny_runs import train_tiny

import metadist
from metadist.api.classification import classifier_inputs
from metadist.datasets.ucr import available_ucr_sets, ucr_ingest_args, write_ucr
from metadist.store.ingest import ingest
from metadist.tasks.inference import classify_windows

SET = "UnitTest"  # 42 cases of 24 steps, 2 classes: the smallest set sktime ships


# NaNs put into three cases before ingest: inside, leading (an inf), a padded tail
HOLES = {1: [5], 2: [0], 3: [20, 21, 22, 23]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if SET not in available_ucr_sets():
        pytest.skip(f"the `ucr` extra (sktime or aeon) with {SET} is not installed")
    tmp = tmp_path_factory.mktemp("classify-nan")
    write_ucr(SET, tmp / "set")
    table = pq.read_table(tmp / "set" / "panel.parquet")
    series = table.column("series").to_numpy(zero_copy_only=False)
    ids = sorted(set(series))
    values = table.column("dim_0").to_numpy().copy()
    cases = [values[series == key] for key in ids]  # the panel's rows are in time order
    labels = [table.column("label")[int(np.flatnonzero(series == key)[0])].as_py() for key in ids]
    holed = [case.copy() for case in cases]
    for case, rows in HOLES.items():
        holed[case][rows] = np.inf if rows == [0] else np.nan
        values[np.flatnonzero(series == ids[case])[rows]] = holed[case][rows]
    pq.write_table(table.set_column(2, "dim_0", pa.array(values)), tmp / "holed.parquet")
    out = {"ids": ids, "cases": cases, "holed": holed, "labels": labels}
    for nan, panel in (
        ("ffill", tmp / "holed.parquet"),
        ("error", tmp / "set" / "panel.parquet"),
        ("drop", tmp / "set" / "panel.parquet"),
    ):
        store = ingest(
            panel, tmp / f"store-{nan}", progress=False, **{**ucr_ingest_args(1), "nan": nan}
        )
        out[nan] = train_tiny(store, tmp / f"run-{nan}", "experiment=ucr_protonet")
    return out


def _examples(runs):
    """Two support cases of each class, and six query cases."""
    cases, labels = runs["cases"], runs["labels"]
    support = [i for c in sorted(set(labels)) for i in np.flatnonzero(np.array(labels) == c)[:2]]
    query = [i for i in range(len(cases)) if i not in support][:6]
    return (
        [cases[i] for i in support],
        [labels[i] for i in support],
        [cases[i].copy() for i in query],
    )


def test_ffill_fills_an_examples_nan_as_ingest_filled_the_store(runs, capsys):
    run = metadist.load_run(runs["ffill"])
    store, sampler = run.source.store, run.source.sampler
    holed = [runs["holed"][case] for case in HOLES]
    capsys.readouterr()
    given = classifier_inputs(classify_windows(sampler), store, holed, "query_x")
    units = np.asarray([list(store.entity_ids).index(runs["ids"][case]) for case in HOLES])
    read = sampler._gather(np.asarray(store.starts)[units], units)  # what training read
    np.testing.assert_allclose(given, read, rtol=0, atol=1e-5)
    support_x, support_labels, query_x = _examples(runs)
    assert run.classify(support_x, support_labels, [*query_x, *holed]).tolist()[-3:] == (
        run.classify(support_x, support_labels, holed).tolist()
    )
    note = capsys.readouterr().err.strip().splitlines()[0]
    assert note == (
        "note: examples: 6 non-finite values filled by the store's --nan ffill rule (the "
        f"first: query_x[{len(query_x)}] has nan in column 'dim_0' at row 5)"
    )
    with pytest.raises(ValueError, match=r"^support_x\[3\] has no finite value in column 'dim_0'$"):
        run.classify([*support_x[:3], np.full(24, np.nan)], support_labels, query_x)


def test_error_refuses_an_examples_nan_naming_its_column_and_row(runs):
    run = metadist.load_run(runs["error"])
    support_x, support_labels, query_x = _examples(runs)
    query_x[1][7] = -np.inf
    with pytest.raises(
        ValueError,
        match=r"^query_x\[1\] has -inf in column 'dim_0' at row 7; the run's store was built "
        r"with --nan error, so the examples must be finite$",
    ):
        run.classify(support_x, support_labels, query_x)


def test_drop_removes_an_examples_non_finite_rows(runs):
    run = metadist.load_run(runs["drop"])
    support_x, support_labels, query_x = _examples(runs)
    holed = [q.copy() for q in query_x]
    holed[0][3] = np.nan
    dropped = [np.delete(query_x[0], 3), *query_x[1:]]
    assert run.classify(support_x, support_labels, holed).tolist() == (
        run.classify(support_x, support_labels, dropped).tolist()
    )
    with pytest.raises(ValueError, match=r"^query_x\[0\] has no row left once the store's --nan"):
        run.classify(support_x, support_labels, [np.full(24, np.nan)])


def test_no_note_when_classify_refuses_the_call(runs, capsys):
    run = metadist.load_run(runs["ffill"])
    support_x, support_labels, query_x = _examples(runs)
    capsys.readouterr()
    with pytest.raises(ValueError, match="^classify needs at least two classes"):
        run.classify(support_x, ["a"] * len(support_x), runs["holed"][1:2])
    assert capsys.readouterr().err == ""
