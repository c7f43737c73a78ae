"""A class of the evaluated split with fewer than K + Q cases is never drawn as a way:
the evaluation's header names it as left out, rather than listing it among the classes
scored as if it were."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tiny_runs import train_tiny

from metadist.datasets.ucr import available_ucr_sets, ucr_ingest_args, write_ucr
from metadist.eval.run import evaluate_run
from metadist.store.ingest import ingest
from metadist.tasks import build_task_sampler

SET = "ArrowHead"  # 211 cases of 3 classes (0, 1, 2)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    if SET not in available_ucr_sets():
        pytest.skip(f"the `ucr` extra (sktime or aeon) with {SET} is not installed")
    tmp = tmp_path_factory.mktemp("short-classes")
    write_ucr(SET, tmp / "set")
    table = pq.read_table(tmp / "set" / "panel.parquet")
    series = table.column("series").to_numpy(zero_copy_only=False)
    labels = table.column("label").to_numpy(zero_copy_only=False)
    kept = sorted(set(series[labels == "2"]))[:3]  # class 2 keeps 3 of its cases
    kept_rows = pc.is_in(table["series"], pa.array(kept, pa.string()))
    table = table.filter(pc.or_(pc.not_equal(table["label"], "2"), kept_rows))
    pq.write_table(table, tmp / "panel.parquet")
    return ingest(tmp / "panel.parquet", tmp / "store", progress=False, **ucr_ingest_args(1))


def test_the_sampler_names_the_classes_it_cannot_draw(store):
    sampler = build_task_sampler(
        "nway_kshot", store, num_ways=2, num_shots=1, num_query=5, lookback=None,
        resample_to=16,
    )  # fmt: skip
    everything = sampler.confined_to(np.arange(sampler.num_units))
    assert everything.short_classes_note() == (
        "; left out, fewer than num_shots + num_query = 6 entities: 2 (3 entities)"
    )
    assert sampler.with_options(num_query=2).confined_to(np.arange(sampler.num_units)) \
        .short_classes_note() == ""  # fmt: skip


def test_training_and_the_evaluation_header_name_the_class_left_out(store, tmp_path, capsys):
    run_dir = train_tiny(store, tmp_path / "run", "experiment=ucr_protonet")
    said = [line for line in capsys.readouterr().err.splitlines() if "never drawn" in line]
    assert len(said) == 1 and re.fullmatch(
        r"note: classes with fewer than num_shots \+ num_query = 6 entities in their split "
        r"are never drawn: meta-train: 2 \((1 entity|2 entities)\)",
        said[0],
    ), said
    result = evaluate_run(
        run_dir, overrides=["eval.max_tasks=4", "eval.scratch_steps=1"], progress=False,
        cache=False,
    )  # fmt: skip
    tasks = result["settings"]["tasks"]
    assert "2-way 1-shot, 5 query per class, from 2 label classes; left out, fewer than " \
        "num_shots + num_query = 6 entities: 2 (" in tasks  # fmt: skip
    header = (run_dir / "eval" / "metrics.md").read_text().splitlines()[2]
    assert "meta-test=[0, 1, 2]" in header and header.count("left out, fewer than") == 1
