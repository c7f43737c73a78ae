"""A few-shot evaluation's header lists each split's classes with numbers as numbers
(`[6, 7, 11]`, it was `[11, 6, 7]`: sorted as text) where the store's class names are
integers (`metadist.natural_order`)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadist.cli import main
from metadist.store import ingest

NUM_CLASSES = 12  # 0..11: two of two digits


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A protonet run of 2 meta-steps on 12 classes named by integers, 6 series each,
    split by class (the experiment's protocol)."""
    tmp = tmp_path_factory.mktemp("class-order")
    rng = np.random.default_rng(0)
    entity, step, value, label = [], [], [], []
    for e in range(NUM_CLASSES * 6):
        entity += [f"e{e:03d}"] * 40
        step += list(range(40))
        value += list(np.sin(np.arange(40) * (1 + e % NUM_CLASSES) / 6) + rng.normal(0, 0.1, 40))
        label += [e % NUM_CLASSES] * 40
    table = {"entity": entity, "t": pa.array(step, pa.int64()), "v": value, "cls": label}
    pq.write_table(pa.table(table), tmp / "panel.parquet")
    store = ingest(
        tmp / "panel.parquet", tmp / "store", entity_col="entity", time_col="t",
        features=["v"], targets=["v"], label_col="cls", progress=False,
    )  # fmt: skip
    assert main(
        ["train", "experiment=synthetic_protonet", f"data.store={store.path}",
         f"run_dir={tmp / 'run'}", "sampler.options.num_ways=2", "sampler.options.lookback=16",
         "trainer.meta_steps=2", "trainer.meta_batch_size=2", "trainer.eval_every=0",
         "logging.progress=false", "logging.wandb.mode=disabled", "--no-eval"]
    ) == 0  # fmt: skip
    return tmp / "run"


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_header_lists_integer_classes_in_numeric_order(run_dir, capsys):
    assert main(
        ["eval", f"run_dir={run_dir}", "eval.max_tasks=4", "eval.scratch_steps=1",
         "eval.pretrain_steps=1", "--no-shared-cache"]
    ) == 0  # fmt: skip
    classes = json.loads((run_dir / "eval" / "metrics.json").read_text())["settings"]["classes"]
    assert sorted(int(c) for names in classes.values() for c in names) == list(range(12))
    # the split puts a class of two digits beside one of one digit somewhere
    assert any({len(c) for c in names} == {1, 2} for names in classes.values()), classes
    for names in classes.values():
        assert names == [str(c) for c in sorted(int(c) for c in names)], classes
    header = capsys.readouterr().out
    shown = ", ".join(f"{split}=[{', '.join(names)}]" for split, names in classes.items())
    assert f"classes: {shown}" in header


def test_natural_order_compares_digits_as_numbers_and_keeps_text():
    from metadist.natural_order import natural_key

    names = ["k10", "k2", "b", "a10", "a9", "10", "9", "01", "1", "x1y10", "x1y2", ""]
    assert sorted(names, key=natural_key) == [
        "", "01", "1", "9", "10", "a9", "a10", "b", "k2", "k10", "x1y2", "x1y10",
    ]  # fmt: skip
    assert sorted([3, 20, 100], key=natural_key) == [3, 20, 100]
