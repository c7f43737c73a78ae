"""MAML's `eval_inner_lr_by_shots`: in eval mode the support set's shot count (read from
its labels) picks the inner step size, `adapt` and meta-val's `forward` alike; other shot
counts, and training, keep theirs; bad values are named in one line; `ucr_maml_tune`
carries it."""

import copy
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_maml_inner_adam import torch_adam
from test_shared_head import classifier, episodes

from metadist.learners import build_learner
from metadist.learners.shots import support_shots

pytestmark = pytest.mark.usefixtures("one_thread")

BY_SHOTS = {1: 0.01}
ROOT = Path(__file__).resolve().parent.parent


def learner_of(model, **options):
    defaults = {
        "loss": "cross_entropy",
        "inner_steps": 2,
        "inner_lr": 0.5,
        "eval_inner_optimizer": "adam",
        "eval_inner_lr": 0.003,
    }
    return build_learner("maml", copy.deepcopy(model), **{**defaults, **options})


@pytest.mark.parametrize(("shots", "rate"), [(1, 0.01), (2, 0.003), (3, 0.003)])
def test_the_support_sets_shot_count_picks_the_eval_step_size(shots, rate):
    model = classifier("mlp").double()
    learner = learner_of(model, eval_inner_lr_by_shots=BY_SHOTS)
    learner.eval()
    batch = episodes(num_tasks=2, num_shots=shots, dtype=torch.float64)
    with torch.no_grad():
        adapted = learner.adapt(batch.support)
    for task in range(2):
        x, y = batch.support.x[task], batch.support.y[task]
        for name, value in torch_adam(model, x, y, 2, lr=rate).items():
            torch.testing.assert_close(adapted[name][task], value.detach(), rtol=1e-9, atol=1e-12)


def test_meta_val_forward_uses_it_and_training_does_not():
    model = classifier("mlp").double()
    batch = episodes(num_tasks=2, num_shots=1, dtype=torch.float64)
    by_shots = learner_of(model, eval_inner_lr_by_shots=BY_SHOTS)
    fixed = {r: learner_of(model, eval_inner_lr=r) for r in (0.01, 0.003)}
    with torch.no_grad():
        for learner in (by_shots, *fixed.values()):
            learner.eval()
        losses = {r: float(fixed[r](batch).loss) for r in fixed}
        assert losses[0.01] != losses[0.003]  # the rates tell apart
        assert float(by_shots(batch).loss) == losses[0.01]
        by_shots.train()
        fixed[0.003].train()
        assert float(by_shots(batch).loss) == float(fixed[0.003](batch).loss)  # inner_lr


def test_support_shots_is_the_fewest_examples_of_a_class():
    y = torch.tensor([[0, 0, 1, 1, 2, 2], [3, 3, 3, 1, 1, 1]])
    assert support_shots(y) == 2
    assert support_shots(torch.tensor([[0, 1, 1, 2, 2, 2]])) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"eval_inner_lr_by_shots": {0: 0.01}}, "keys must be shot counts, ints >= 1"),
        ({"eval_inner_lr_by_shots": {1: 0}}, "values must be numbers > 0"),
        ({"eval_inner_lr_by_shots": {1: True}}, "values must be numbers > 0"),
        ({"eval_inner_lr_by_shots": [0.01]}, "eval_inner_lr_by_shots must be a mapping"),
        (
            {"eval_inner_lr_by_shots": BY_SHOTS, "learn_inner_lr": True, "eval_inner_lr": None},
            "eval_inner_lr_by_shots has no effect with learn_inner_lr",
        ),
        ({"eval_inner_lr_by_shots": BY_SHOTS, "loss": "mse"}, "needs loss: cross_entropy"),
    ],
)
def test_bad_values_are_named_in_one_line(options, message):
    with pytest.raises(ValueError) as raised:
        learner_of(classifier("mlp"), **options)
    text = str(raised.value)
    assert "eval_inner_lr_by_shots" in text and message in text
    assert "\n" not in text


def test_digit_string_keys_read_as_shot_counts():
    learner = learner_of(classifier("mlp"), eval_inner_lr_by_shots={"1": 0.01})
    assert learner._eval_lr_by_shots == {1: 0.01}


def test_ucr_maml_tune_carries_the_one_shot_rate():
    """The recipe's learner options (composed with a store in
    `test_train_selection.py`'s UCR recipe tests) build a learner with 0.01 at 1 shot."""
    recipe = OmegaConf.load(ROOT / "experiments" / "experiment" / "ucr_maml_tune.yaml")
    options = OmegaConf.to_container(recipe.learner.options)
    assert options["eval_inner_lr_by_shots"] == {1: 0.01}
    assert options["eval_inner_lr"] == 0.003 and options["eval_inner_steps"] == 100
    options.update(shared_head=False, prototype_head=False)  # the test's model has no head
    learner = build_learner("maml", classifier("mlp"), **options)
    assert learner._eval_lr_by_shots == {1: 0.01}
