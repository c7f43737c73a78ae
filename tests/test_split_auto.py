"""`data.split_by=auto` (the UCR recipes): class-disjoint where the classes allow it, else
cases dealt by class; the evaluation names the protocol and every split's classes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from metadist.data import build_partitioner
from metadist.data.splits import describe_split, split_protocol
from metadist.datasets.ucr import read_ts, ucr_ingest_args, ucr_table
from metadist.store import ingest
from metadist.tasks import build_task_sampler


def _ts_text(num_classes: int, per_class: int, seed: int) -> str:
    """A univariate UCR `.ts` file: class c is a sine of frequency c + 1, lengths 20..27."""
    rng = np.random.default_rng(seed)
    names = [f"leaf{c}" for c in range(num_classes)]
    lines = [
        "@problemName Leaves",
        "@timeStamps false",
        "@missing false",
        "@univariate true",
        "@equalLength false",
        f"@classLabel true {' '.join(names)}",
        "@data",
    ]
    for i in range(num_classes * per_class):
        c = i % num_classes
        t = np.linspace(0, 2 * np.pi, 20 + i % 8)
        values = np.sin((c + 1) * t) + 0.2 * rng.standard_normal(len(t))
        lines.append(",".join(f"{v:.5f}" for v in values) + f":{names[c]}")
    return "\n".join(lines) + "\n"


def _ucr_store(directory, num_classes: int, per_class: int = 5):
    """A store of a small UCR set written as `.ts` files and read as `metadist datasets
    ucr` reads them, ingested with the arguments it prints."""
    directory.mkdir(parents=True, exist_ok=True)
    parts = {}
    for part, seed in (("train", 0), ("test", 1)):
        path = directory / f"Leaves_{part.upper()}.ts"
        path.write_text(_ts_text(num_classes, per_class, seed))
        parts[part] = read_ts(path)
    pq.write_table(ucr_table("Leaves", parts), directory / "panel.parquet")
    args = ucr_ingest_args(1)
    return ingest(directory / "panel.parquet", directory / "store", progress=False, **args)


@pytest.fixture(scope="module")
def three_classes(tmp_path_factory):
    return _ucr_store(tmp_path_factory.mktemp("three_classes"), 3)


@pytest.fixture(scope="module")
def six_classes(tmp_path_factory):
    return _ucr_store(tmp_path_factory.mktemp("six_classes"), 6)


def _sampler(store, **options):
    options = {"num_ways": 2, "num_shots": 1, "num_query": 1, "lookback": None, **options}
    return build_task_sampler("nway_kshot", store, resample_to=16, **options)


@pytest.mark.parametrize(
    ("fractions", "expected"),
    [
        ((0.5, 0.0, 0.5), {3: "unit", 4: "label", 6: "label"}),
        ((0.6, 0.2, 0.2), {3: "unit", 4: "unit", 6: "unit"}),  # meta-val would get one
        ((0.4, 0.3, 0.3), {3: "unit", 4: "unit", 6: "label"}),
    ],
)
def test_auto_splits_by_class_only_where_every_split_gets_two(tmp_path, fractions, expected):
    for num_classes, protocol in expected.items():
        store = _ucr_store(tmp_path / f"{num_classes}_{fractions[1]}", num_classes, per_class=4)
        assert split_protocol(_sampler(store), store, fractions, "auto") == protocol
    assert split_protocol(_sampler(store), store, fractions, None) == "unit"


def test_auto_draws_exactly_the_protocol_it_resolves_to(three_classes, six_classes):
    for store, protocol in ((three_classes, "unit"), (six_classes, "label")):
        sampler = _sampler(store)
        auto = build_partitioner(sampler, store, seed=4, fractions=(0.5, 0, 0.5), split_by="auto")
        stratify = "label" if protocol == "unit" else "stratum"
        same = build_partitioner(
            sampler, store, seed=4, fractions=(0.5, 0, 0.5), split_by=protocol, stratify_by=stratify
        )
        classes = sampler.unit_classes()
        for split in ("train", "test"):
            np.testing.assert_array_equal(auto.units(split), same.units(split))
        train, test = (set(classes[auto.units(s)].tolist()) for s in ("train", "test"))
        if protocol == "label":
            assert not train & test and len(train) == len(test) == 3
        else:  # cases dealt by class: every split holds every class
            assert train == test == {0, 1, 2}


def test_describe_split_names_the_protocol_and_the_classes(three_classes, six_classes):
    class Data:
        fractions, split_by = (0.5, 0.0, 0.5), "auto"

    for store, disjoint in ((three_classes, False), (six_classes, True)):
        sampler = _sampler(store)
        part = build_partitioner(sampler, store, seed=0, fractions=Data.fractions, split_by="auto")
        described = describe_split(sampler, store, part, Data)
        expected = "auto, by label class" if disjoint else "auto, by unit"
        assert described["split protocol"].startswith(expected)
        classes = described["classes"]
        assert classes["meta-val"] == []
        for split in ("train", "test"):
            names = store.label_names[np.unique(sampler.unit_classes()[part.units(split)])]
            assert classes[f"meta-{split}"] == [str(n) for n in names]
        overlap = set(classes["meta-train"]) & set(classes["meta-test"])
        assert bool(overlap) != disjoint


@pytest.mark.integration
def test_a_three_class_set_trains_with_the_shipped_ucr_recipe(three_classes, tmp_path, capsys):
    from metadist.eval import evaluate_run
    from metadist.train.__main__ import main

    run_dir = tmp_path / "run"
    common = [
        "experiment=ucr_protonet",
        f"data.store={three_classes.path}",
        f"run_dir={run_dir}",
        "sampler.options.num_query=2",
        "trainer.meta_steps=3",
        "trainer.meta_batch_size=2",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        "--no-eval",
    ]
    assert main(common) == 0  # the recipe's 5 ways fitted to the set's 3 classes
    printed = capsys.readouterr()
    assert "split by auto (unit)" in printed.out + printed.err  # the protocol the run got
    result = evaluate_run(
        run_dir,
        overrides=["eval.scratch_steps=2", "eval.pretrain_steps=3", "eval.tasks_per_unit=1"],
    )
    settings = json.loads((run_dir / "eval" / "metrics.json").read_text())["settings"]
    assert settings["split protocol"].startswith("auto, by unit")
    names = ["leaf0", "leaf1", "leaf2"]
    assert settings["classes"] == {"meta-train": names, "meta-val": [], "meta-test": names}
    assert settings["model selection"].startswith("off: meta-val has no share")
    header = (run_dir / "eval" / "metrics.md").read_text().splitlines()[2]
    assert "meta-test=[leaf0, leaf1, leaf2]" in header and "split protocol: auto" in header
    assert {"adapted", "baseline_pp", "pretrained"} <= set(result["overall"])


def test_fit_ways_lowers_n_to_what_every_split_in_use_can_give(six_classes, capsys):
    with pytest.raises(ValueError, match="num_ways=7 .*sampler.options.fit_ways=true"):
        _sampler(six_classes, num_ways=7)  # 6 classes: without fit_ways, an error
    sampler = _sampler(six_classes, num_ways=5, fit_ways=True)
    assert sampler.num_ways == 5  # 6 classes with K + Q cases: 5 fit
    partitioner = build_partitioner(
        sampler, six_classes, split_by="label", fractions=(0.5, 0.0, 0.5), seed=0
    )
    sampler.fit_ways_to(partitioner)
    assert sampler.num_ways == 3  # 3 / 3 classes: the smaller split gives 3
    batch = sampler.confined_to(partitioner.units("test")).sample(
        np.zeros(2, dtype=np.int64), np.arange(2, dtype=np.uint64)
    )
    assert int(batch.support.y.max()) + 1 == 3
    # evaluation settings asking for more ways than the classes give: said, not silent
    every = np.arange(len(sampler.unit_entity))  # 6 classes in all
    sampler.for_evaluation(every, num_ways=7, max_tasks=2)
    assert "note: eval.sampler_options num_ways=7 lowered to 6" in capsys.readouterr().err


def test_a_split_that_cannot_give_tasks_is_refused_before_training(six_classes, tmp_path):
    """Class-disjoint splits whose meta-test holds one class: refused before a step (the
    evaluation found it after the whole training), naming the split and the lever."""
    from metadist.train import train
    from metadist.train.compose import load_config

    config = load_config(
        ["experiment=ucr_protonet", f"data.store={six_classes.path}", "data.split_by=label",
         "data.fractions=[0.9,0.0,0.1]", "sampler.options.fit_ways=true",
         f"run_dir={tmp_path / 'run'}"],
        world_size=1,
    )  # fmt: skip
    with pytest.raises(
        ValueError, match="the meta-test split cannot give tasks: .*use data.split_by"
    ):
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_lowering_the_ways_is_noted(six_classes, capsys):
    """`fit_ways` lowers N where a split has fewer classes; the run says so (it was
    silent, and the header named the classes only)."""
    from metadist.train.build import build_task_source
    from metadist.train.compose import load_config

    config = load_config(
        ["experiment=ucr_protonet", f"data.store={six_classes.path}", "data.split_by=label",
         "data.fractions=[0.5,0.0,0.5]", "sampler.options.num_ways=5",
         "sampler.options.fit_ways=true"],
        world_size=1,
    )  # fmt: skip
    capsys.readouterr()
    source = build_task_source(config)
    assert source.sampler.num_ways == 3
    assert "note: sampler.options.num_ways=5 lowered to 3" in capsys.readouterr().err
    # N above the store's 6 classes: the note names the N asked for, not the 5 the
    # store alone allowed (and is given where the store alone lowered it, too)
    config.sampler.options["num_ways"] = 20
    build_task_source(config)
    assert "note: sampler.options.num_ways=20 lowered to 3" in capsys.readouterr().err
    config.sampler.options["num_ways"] = 8
    config.data.fractions = [1.0, 0.0, 0.0]
    build_task_source(config)
    assert "note: sampler.options.num_ways=8 lowered to 6" in capsys.readouterr().err
    # a trained run's parts rebuilt for evaluation or inference: said when it trained
    build_task_source(config, notes=False)
    assert "lowered" not in capsys.readouterr().err
