"""Selection on meta-val considers the model right after classifier pre-training (step 0):
where meta-training does not beat it on meta-val, the pretrained model is what the run
keeps and evaluates (Meta-Baseline's model selection)."""

from __future__ import annotations

import json

import pytest
import torch
from test_split_auto import _ucr_store
from test_train_selection import _ucr, val_records

from metadist.train import load_checkpoint, train
from metadist.train.checkpoint import selected_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def six_classes(tmp_path_factory):
    """A small UCR set of 6 classes: 2 / 2 / 2 by class with the fractions below."""
    return _ucr_store(tmp_path_factory.mktemp("six_classes"), 6, per_class=5)


def _run(store, run_dir, *overrides):
    config = _ucr(
        "ucr_metabaseline",
        store,
        run_dir,
        "data.fractions=[0.4,0.3,0.3]",  # a meta-val split of its own classes
        "pretrain.steps=3",
        "trainer.meta_steps=4",
        "trainer.eval_every=2",
        "selection.patience=null",
        *overrides,
    )
    return config, train(config)


def test_the_pretrained_model_is_evaluated_and_kept_where_nothing_beats_it(six_classes, tmp_path):
    # No later evaluation can beat the first by more than min_delta: the first is kept.
    config, result = _run(six_classes, tmp_path / "run", "selection.min_delta=10")
    assert result.step == 4
    assert [r["step"] for r in val_records(config.resolved_run_dir)] == [0, 2, 4]
    best = json.loads((config.resolved_run_dir / "best.json").read_text())
    assert best["step"] == 0
    path, _ = selected_checkpoint(config.resolved_run_dir)
    assert path.name == "step_00000000.pt"
    # It holds the pretrained weights: those the pre-training phase saved at its end.
    pretrained = torch.load(config.resolved_run_dir / "pretrain.pt", weights_only=False)["model"]
    kept = load_checkpoint(path)["learner"]
    for key, value in pretrained.items():
        torch.testing.assert_close(kept["model." + key], value, rtol=0, atol=0)
    last = load_checkpoint(config.resolved_run_dir / "checkpoints" / "step_00000004.pt")
    assert any(not torch.equal(last["learner"]["model." + k], v) for k, v in pretrained.items())


def test_without_pretraining_the_first_evaluation_is_after_training(six_classes, tmp_path):
    config, _ = _run(six_classes, tmp_path / "run", "pretrain.steps=0")
    assert [r["step"] for r in val_records(config.resolved_run_dir)] == [2, 4]
