"""Model selection on meta-val and early stopping: the best checkpoint, patience, resume."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from test_train_loop import TINY, assert_bit_identical, params, tiny_config

from metadist.train import latest_checkpoint_state, load_checkpoint, save_checkpoint, train
from metadist.train.checkpoint import checkpoint_dir, selected_checkpoint
from metadist.train.logging import read_metrics
from metadist.train.resume import finished_before
from metadist.train.selection import (
    Selection,
    SelectionConfig,
    check_val_metric,
    describe_checkpoint,
)

# Selecting the *largest* meta-val loss makes the first evaluation the best and every
# later one (the loss falls as the run trains) no improvement: a run whose best and whose
# early stop are known in advance.
WORST_IS_BEST = ["selection.mode=max", "trainer.eval_every=2", "trainer.checkpoint_every=100"]


def val_records(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["split"] == "val"]


def test_the_default_metric_follows_the_learners_loss():
    classifier = Selection(SelectionConfig(), "cross_entropy")
    assert (classifier.metric, classifier.mode) == ("query_accuracy_after", "max")
    regressor = Selection(SelectionConfig(), "mse")
    assert (regressor.metric, regressor.mode) == ("query_loss_after", "min")
    chosen = Selection(SelectionConfig(metric="loss", mode="max"), "mse")
    assert (chosen.metric, chosen.mode) == ("loss", "max")


def test_a_misspelt_selection_metric_of_a_built_in_learner_is_refused_before_training(tmp_path):
    config = tiny_config(tmp_path / "run", "selection.metric=query_los_after")
    with pytest.raises(ValueError, match="selection.metric=query_los_after: .*query_loss_after"):
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists()
    # a config holding such a name still loads (a saved run of it is read back)
    SelectionConfig(metric="query_los_after").validate()
    check_val_metric("selection.metric", "query_loss_after", "maml")
    check_val_metric("selection.metric", "a_metric_of_mine", "maml")
    check_val_metric("selection.metric", "support_loss_after", "a_learner_of_mine")


def test_an_improvement_must_beat_the_best_by_min_delta():
    selection = Selection(SelectionConfig(min_delta=0.1, patience=2), "mse")
    assert selection.update(1, {"query_loss_after": 1.0}, "a")
    assert not selection.update(2, {"query_loss_after": 0.95}, "b")  # within min_delta
    assert selection.update(3, {"query_loss_after": 0.85}, "c")
    assert (selection.best_step, selection.best_checkpoint, selection.bad_evals) == (3, "c", 0)
    assert not selection.update(4, {"query_loss_after": float("nan")}, "d")
    assert not selection.exhausted
    assert not selection.update(5, {"query_loss_after": 2.0}, "e")
    assert selection.exhausted


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("selection.patience=0", "selection.patience"),
        ("selection.mode=up", "selection.mode"),
        ("selection.min_delta=-1", "selection.min_delta"),
    ],
)
def test_bad_selection_settings_name_the_field(tmp_path, override, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(tmp_path / "run", "trainer.eval_every=2", override)


def test_patience_without_evaluation_is_a_note(tmp_path, capsys):
    config = tiny_config(
        tmp_path / "run", "trainer.meta_steps=2", "trainer.eval_every=0", "selection.patience=3"
    )
    assert train(config).step == 2
    assert "selection.patience=3 does not apply: trainer.eval_every=0" in capsys.readouterr().err
    assert not (config.resolved_run_dir / "best.json").exists()


def test_a_metric_the_learner_does_not_report_is_named(tmp_path):
    config = tiny_config(
        tmp_path / "run", "trainer.meta_steps=4", "trainer.eval_every=2", "selection.metric=acc"
    )
    with pytest.raises(ValueError, match="selection.metric='acc'.*query_loss_after"):
        train(config)


def test_the_best_checkpoint_is_pointed_at_and_never_pruned(tmp_path):
    config = tiny_config(
        tmp_path / "run", "trainer.meta_steps=12", "trainer.keep_checkpoints=1", *WORST_IS_BEST
    )
    result = train(config)
    assert result.step == 12 and not result.early_stopped
    run_dir = config.resolved_run_dir
    records = val_records(run_dir)
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10, 12]
    best = max(records, key=lambda r: r["query_loss_after"])
    assert best["step"] == 2
    # keep_checkpoints=1 keeps the latest, and the best beside it
    names = sorted(p.name for p in checkpoint_dir(run_dir).glob("step_*.pt"))
    assert names == ["step_00000002.pt", "step_00000012.pt"]
    pointer = json.loads((checkpoint_dir(run_dir) / "best").read_text())
    record = json.loads((run_dir / "best.json").read_text())
    expected = {
        "checkpoint": "step_00000002.pt",
        "step": 2,
        "split": "val",
        "metric": "query_loss_after",
        "mode": "max",
        "value": best["query_loss_after"],
    }
    assert record == expected
    assert {k: pointer[k] for k in expected} == expected
    state = load_checkpoint(checkpoint_dir(run_dir) / pointer["checkpoint"], pointer)
    assert state["step"] == 2 and state["selection"]["bad_evals"] == 0
    path, found = selected_checkpoint(run_dir)
    assert path.name == "step_00000002.pt"
    assert describe_checkpoint(path, found) == (
        f"step_00000002.pt (best by val query_loss_after = {best['query_loss_after']:.4g})"
    )
    assert selected_checkpoint(run_dir, "latest")[0].name == "step_00000012.pt"
    assert latest_checkpoint_state(run_dir)["selection"]["bad_evals"] == 5


def test_the_default_selection_keeps_the_lowest_val_loss(tmp_path):
    config = tiny_config(tmp_path / "run", "trainer.meta_steps=8", "trainer.eval_every=2")
    train(config)
    records = val_records(config.resolved_run_dir)
    best = min(records, key=lambda r: r["query_loss_after"])
    record = json.loads((config.resolved_run_dir / "best.json").read_text())
    assert (record["step"], record["value"]) == (best["step"], best["query_loss_after"])
    assert record["metric"] == "query_loss_after" and record["mode"] == "min"


def test_pruning_spares_the_checkpoint_best_points_at(tmp_path):
    state = {"w": torch.zeros(1)}
    for step in range(1, 6):
        record = {"metric": "m", "mode": "min", "value": 1.0} if step == 2 else None
        save_checkpoint(tmp_path, step, state, keep=2, best=record)
    names = sorted(p.name for p in checkpoint_dir(tmp_path).glob("step_*.pt"))
    assert names == ["step_00000002.pt", "step_00000004.pt", "step_00000005.pt"]
    assert selected_checkpoint(tmp_path)[0].name == "step_00000002.pt"


def test_patience_stops_the_run_with_a_final_checkpoint(tmp_path, capsys):
    config = tiny_config(
        tmp_path / "run", "trainer.meta_steps=40", "selection.patience=3", *WORST_IS_BEST
    )
    result = train(config)
    # evaluations at 2 (the best), 4, 6, 8: three without improvement
    assert result.early_stopped and result.stopped_by is None and result.step == 8
    assert latest_checkpoint_state(config.resolved_run_dir)["step"] == 8
    err = capsys.readouterr().err
    assert "early stop at step 8: val query_loss_after has not improved for 3 evaluations" in err
    assert "(step_00000002.pt)" in err
    assert [r["step"] for r in val_records(config.resolved_run_dir)] == [2, 4, 6, 8]

    # The same command again trains nothing; a larger patience goes on from there.
    again = train(config)
    assert again.early_stopped and again.step == 8
    assert "nothing to train" in capsys.readouterr().err
    overrides = [*TINY, f"run_dir={config.resolved_run_dir}", "trainer.meta_steps=40"]
    assert finished_before([*overrides, "selection.patience=3", *WORST_IS_BEST], result.run_dir)
    assert not finished_before([*overrides, "selection.patience=5", *WORST_IS_BEST], result.run_dir)
    longer = train(
        tiny_config(
            tmp_path / "run", "trainer.meta_steps=40", "selection.patience=5", *WORST_IS_BEST
        )
    )
    assert longer.early_stopped and longer.step == 12


def _sigterm_at_six(step, values):
    if step == 6:
        os.kill(os.getpid(), signal.SIGTERM)


class _Crash(RuntimeError):
    pass


def _crash_at_eight(step, values):
    if step == 8:
        raise _Crash("killed")


@pytest.mark.parametrize("interruption", ["sigterm", "crash"])
def test_a_stopped_and_resumed_run_stops_early_at_the_same_step(tmp_path, interruption):
    """The patience count is in the checkpoint: a run stopped (SIGTERM: checkpoint at
    step 7) or killed (an error at step 8: the last checkpoint is step 6's) and resumed
    makes the same early-stop decision at the same step as an uninterrupted run."""
    schedule = [
        "trainer.meta_steps=40",
        "selection.patience=4",
        "selection.mode=max",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=3",
    ]
    reference = train(tiny_config(tmp_path / "straight", *schedule))
    assert reference.early_stopped and reference.step == 10

    config = tiny_config(tmp_path / "stopped", *schedule)
    if interruption == "sigterm":
        first = train(config, on_eval=_sigterm_at_six)
        assert first.stopped_by == "SIGTERM" and first.step == 7
    else:
        with pytest.raises(_Crash):
            train(config, on_eval=_crash_at_eight)
        assert latest_checkpoint_state(config.resolved_run_dir)["step"] == 6
    second = train(config)
    assert second.early_stopped and second.step == reference.step
    assert_bit_identical(params(second.learner), params(reference.learner))
    best = (config.resolved_run_dir / "best.json").read_text()
    assert best == (reference.run_dir / "best.json").read_text()
    a = latest_checkpoint_state(config.resolved_run_dir)["selection"]
    b = latest_checkpoint_state(reference.run_dir)["selection"]
    assert a == b and a["bad_evals"] == 4


def test_a_resume_repoints_best_at_the_record_of_its_checkpoint(tmp_path):
    """A run stopped after moving `latest` but before `best` (here: `best` removed) gets
    its `best` back from the record of the checkpoint it resumes from."""
    config = tiny_config(tmp_path / "run", "trainer.meta_steps=6", *WORST_IS_BEST)
    train(config)
    directory = checkpoint_dir(config.resolved_run_dir)
    pointer = (directory / "best").read_text()
    (directory / "best").unlink()
    assert selected_checkpoint(config.resolved_run_dir)[0].name == "step_00000006.pt"
    train(tiny_config(tmp_path / "run", "trainer.meta_steps=6", *WORST_IS_BEST))
    assert (directory / "best").read_text() == pointer


def test_meta_val_without_a_share_is_a_note_not_an_error(tmp_path, capsys):
    config = tiny_config(
        tmp_path / "run",
        "trainer.meta_steps=4",
        "trainer.eval_every=2",
        "selection.patience=1",
        "data.fractions=[0.9,0.0,0.1]",
    )
    result = train(config)
    assert result.step == 4 and not result.early_stopped
    assert "gives meta-val no share" in capsys.readouterr().err
    assert val_records(config.resolved_run_dir) == []
    assert not (checkpoint_dir(config.resolved_run_dir) / "best").exists()


def test_evaluation_scores_the_best_checkpoint_unless_told_the_latest(tmp_path):
    from metadist.eval import evaluate_run
    from metadist.eval.trained import load_run

    config = tiny_config(tmp_path / "run", "trainer.meta_steps=6", *WORST_IS_BEST)
    train(config)
    run_dir = config.resolved_run_dir
    value = json.loads((run_dir / "best.json").read_text())["value"]
    _, state, path, _ = load_run(run_dir, "run_dir")
    assert path.name == "step_00000002.pt" and state["step"] == 2
    cheap = ["eval.max_tasks=8", "eval.scratch_steps=1"]
    best = evaluate_run(run_dir, overrides=cheap, write=False)
    assert best["settings"]["checkpoint"] == (
        f"step_00000002.pt (best by val query_loss_after = {value:.4g})"
    )
    assert best["title"].endswith("after 2 meta-steps")
    latest = evaluate_run(run_dir, overrides=[*cheap, "eval.checkpoint=latest"], write=False)
    assert latest["settings"]["checkpoint"] == "step_00000006.pt"
    assert latest["title"].endswith("after 6 meta-steps")
    assert latest["overall"] != best["overall"]
    with pytest.raises(ValueError, match="eval.checkpoint must be 'best' or 'latest'"):
        evaluate_run(run_dir, overrides=["eval.checkpoint=first"], write=False)


def test_a_damaged_best_pointer_says_how_to_evaluate_the_latest(tmp_path):
    from metadist.train import CheckpointError

    config = tiny_config(tmp_path / "run", "trainer.meta_steps=4", *WORST_IS_BEST)
    train(config)
    directory = checkpoint_dir(config.resolved_run_dir)
    (directory / "step_00000002.pt").unlink()
    with pytest.raises(
        CheckpointError, match="best points at 'step_00000002.pt', which does not exist"
    ):
        selected_checkpoint(config.resolved_run_dir)
    (directory / "best").write_text("{")
    with pytest.raises(CheckpointError, match="not a metadist checkpoint pointer"):
        selected_checkpoint(config.resolved_run_dir)
    assert selected_checkpoint(config.resolved_run_dir, "latest")[0].name == "step_00000004.pt"


# --- the shipped recipes -------------------------------------------------------------

NUM_CLASSES, PER_CLASS = 10, 4


def _class_store(directory, scaling):
    """10 classes of 4 entities; feature `code` = entity * 10000 + row (unscaled, every
    input value says which entity, and so which class, it came from)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from metadist.store import ingest

    entity = np.repeat(np.arange(NUM_CLASSES * PER_CLASS), 30)
    row = np.tile(np.arange(30), NUM_CLASSES * PER_CLASS)
    table = pa.table(
        {
            "entity": [f"e{e:03d}" for e in entity],
            "t": pa.array(row, pa.int64()),
            "code": (entity * 10000 + row).astype(np.float64),
            "cls": [f"k{e % NUM_CLASSES}" for e in entity],
        }
    )
    pq.write_table(table, directory / "panel.parquet")
    return ingest(
        directory / "panel.parquet",
        directory / "store",
        entity_col="entity",
        time_col="t",
        features=["code"],
        targets=["code"],
        label_col="cls",
        scaling=scaling,
        progress=False,
    )


@pytest.fixture(scope="module")
def class_store(tmp_path_factory):
    return _class_store(tmp_path_factory.mktemp("class_store"), "none")


@pytest.fixture(scope="module")
def scaled_class_store(tmp_path_factory):
    """Each entity z-normalised, as the UCR ingest does: fit to train on."""
    return _class_store(tmp_path_factory.mktemp("scaled_class_store"), "per-entity")


def _ucr(experiment, store, run_dir, *overrides):
    from metadist.train import load_config

    return load_config(
        [
            f"experiment={experiment}",
            f"data.store={store.path}",
            f"run_dir={run_dir}",
            "sampler.options.num_ways=2",
            "sampler.options.num_query=2",
            "sampler.options.resample_to=16",
            "trainer.meta_batch_size=2",
            "logging.progress=false",
            "logging.wandb.mode=disabled",
            *overrides,
        ],
        world_size=1,
    )


UCR_EXPERIMENTS = [
    "ucr_maml",
    "ucr_maml_plus",
    "ucr_maml_pretrained",
    "ucr_maml_tune",
    "ucr_maml_adam",
    "ucr_protonet",
    "ucr_metabaseline",
    "ucr_metabaseline_ft",
    "ucr_metabaseline_adam",
    "ucr_metabaseline_tune",
]


@pytest.mark.parametrize("experiment", UCR_EXPERIMENTS)
def test_ucr_meta_val_classes_are_disjoint_from_train_and_test(class_store, tmp_path, experiment):
    import numpy as np

    from metadist.train.build import build_parts
    from metadist.train.distributed import read_env

    # the values must stay as stored (they encode entity and row): no case z-normalisation
    config = _ucr(
        experiment,
        class_store,
        tmp_path / "run",
        "data.fractions=[0.6,0.2,0.2]",
        "sampler.options.z_normalise=false",
    )
    # auto: 10 classes give every split 2 or more, so the split is by class
    assert config.data.split_by == "auto" and config.trainer.eval_every > 0
    parts = build_parts(config, read_env("cpu"))
    codes = np.asarray(class_store.label_codes)
    entity_of_unit = parts.sampler.unit_entities()
    classes = {
        split: set(codes[entity_of_unit[parts.partitioner.units(split)]].tolist())
        for split in ("train", "val", "test")
    }
    assert [len(classes[s]) for s in ("train", "val", "test")] == [6, 2, 2]
    assert not classes["val"] & classes["train"] and not classes["val"] & classes["test"]
    assert not classes["train"] & classes["test"]
    # Every example of every meta-val episode (support and query) is of a meta-val class.
    row_of = {str(e): i for i, e in enumerate(class_store.entity_ids)}
    seen = set()
    assert parts.val_loader is not None
    for batch in parts.val_loader:
        for x in (batch.support.x, batch.query.x):
            entities = np.unique(np.floor(x.numpy() / 10000).astype(int))
            seen |= {int(codes[row_of[f"e{e:03d}"]]) for e in entities}
    assert seen == classes["val"]


@pytest.mark.parametrize("experiment", ["ucr_protonet", "ucr_maml"])
def test_a_ucr_run_with_meta_val_classes_keeps_its_most_accurate_checkpoint(
    scaled_class_store, tmp_path, experiment
):
    config = _ucr(
        experiment,
        scaled_class_store,
        tmp_path / "run",
        "data.fractions=[0.6,0.2,0.2]",
        "trainer.meta_steps=6",
        "trainer.eval_every=2",
    )
    assert config.selection.patience is not None  # the recipe's
    train(config)
    records = val_records(config.resolved_run_dir)
    best = json.loads((config.resolved_run_dir / "best.json").read_text())
    assert (best["metric"], best["mode"]) == ("query_accuracy_after", "max")
    top = max(r["query_accuracy_after"] for r in records)
    first = next(r for r in records if r["query_accuracy_after"] == top)
    assert (best["step"], best["value"]) == (first["step"], top)


def test_the_shipped_ucr_recipes_run_without_meta_val_classes(scaled_class_store, tmp_path, capsys):
    """data/ucr.yaml gives meta-val no share: the recipe trains all its steps, saying so."""
    config = _ucr("ucr_protonet", scaled_class_store, tmp_path / "run", "trainer.meta_steps=2")
    assert config.data.fractions[1] == 0
    result = train(config)
    assert result.step == 2 and not result.early_stopped
    assert "gives meta-val no share" in capsys.readouterr().err
    assert selected_checkpoint(config.resolved_run_dir)[0].name == "step_00000002.pt"


@pytest.mark.parametrize("experiment", [*UCR_EXPERIMENTS, "synthetic_maml", "synthetic_protonet"])
def test_the_shipped_recipes_select_on_meta_val_and_stop_early(experiment):
    from metadist.train.compose import compose_dict

    values = compose_dict([f"experiment={experiment}"])
    trainer, selection = values["trainer"], values["selection"]
    assert trainer["eval_every"] > 0 and selection["patience"] >= 1
    # meta_steps is the upper bound: patience can stop a run well before it
    assert trainer["eval_every"] * selection["patience"] <= trainer["meta_steps"] / 2
    # evaluation stays cheap: a few batches every time, a small share of the training
    num_evals = trainer["meta_steps"] // trainer["eval_every"]
    assert (
        trainer["eval_batches"] <= 4
        and num_evals * trainer["eval_batches"] <= 0.1 * (trainer["meta_steps"])
    )
