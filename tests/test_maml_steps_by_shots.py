"""MAML's `eval_inner_steps_by_shots`: in eval mode the support set's shot count (read from
its labels) picks how many steps `adapt` takes; other shot counts, an explicit `steps`,
and training keep theirs; bad values are named in one line; `ucr_maml_adam` carries it."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_maml_inner_adam import torch_adam
from test_maml_lr_by_shots import learner_of as lr_learner_of
from test_shared_head import classifier, episodes

from metadist.learners import build_learner

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parent.parent


# test_maml_lr_by_shots' learner (Adam at 0.003 in eval mode), trained by one Adam step
# at 0.003 and evaluated with 4 steps unless the shot count says otherwise
ADAM_TRAINING = {"inner_steps": 1, "inner_lr": 0.003, "first_order": True, "eval_inner_steps": 4}


def learner_of(model, **options):
    return lr_learner_of(model, **{"inner_optimizer": "adam", **ADAM_TRAINING, **options})


def assert_adapted_by(adapted, model, batch, steps):
    for task in range(batch.support.x.shape[0]):
        x, y = batch.support.x[task], batch.support.y[task]
        for name, value in torch_adam(model, x, y, steps, lr=0.003).items():
            torch.testing.assert_close(adapted[name][task], value.detach(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("shots", "steps"), [(1, 2), (2, 4), (3, 4)])
def test_the_support_sets_shot_count_picks_the_eval_step_count(shots, steps):
    model = classifier("mlp").double()
    learner = learner_of(model, eval_inner_steps_by_shots={1: 2})
    learner.eval()
    batch = episodes(num_tasks=2, num_shots=shots, dtype=torch.float64)
    with torch.no_grad():
        adapted = learner.adapt(batch.support)
    assert_adapted_by(adapted, model, batch, steps)


def test_an_explicit_step_count_and_training_keep_theirs():
    model = classifier("mlp").double()
    learner = learner_of(model, eval_inner_steps_by_shots={1: 2})
    batch = episodes(num_tasks=2, num_shots=1, dtype=torch.float64)
    learner.eval()
    with torch.no_grad():
        explicit = learner.adapt(batch.support, steps=3)
        learner.train()
        training = learner.adapt(batch.support)
    assert_adapted_by(explicit, model, batch, 3)
    assert_adapted_by(training, model, batch, 1)  # inner_steps


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({0: 2}, "keys must be shot counts, ints >= 1"),
        ({1: 0}, "values must be ints >= 1"),
        ({1: 2.5}, "values must be ints >= 1"),
        ({1: True}, "values must be ints >= 1"),
        ([25], "must be a mapping"),
    ],
)
def test_bad_values_are_named_in_one_line(value, message):
    with pytest.raises(ValueError) as raised:
        learner_of(classifier("mlp"), eval_inner_steps_by_shots=value)
    text = str(raised.value)
    assert "eval_inner_steps_by_shots" in text and message in text
    assert "\n" not in text


def test_it_needs_a_classification_loss():
    with pytest.raises(ValueError, match="eval_inner_steps_by_shots needs loss: cross_entropy"):
        learner_of(classifier("mlp"), loss="mse", eval_inner_steps_by_shots={1: 2})


def test_digit_string_keys_read_as_shot_counts():
    learner = learner_of(classifier("mlp"), eval_inner_steps_by_shots={"1": 25})
    assert learner.eval_steps_by_shots == {1: 25}


def test_ucr_maml_adam_carries_its_one_shot_steps_and_rate():
    """The recipe's learner options (composed with a store in `test_train_selection.py`'s
    UCR recipe tests) build a learner with 25 steps at 0.003 at 1 shot, 50 at 0.01 else."""
    recipe = OmegaConf.load(ROOT / "experiments" / "experiment" / "ucr_maml_adam.yaml")
    options = OmegaConf.to_container(recipe.learner.options)
    assert options["eval_inner_steps_by_shots"] == {1: 25}
    assert options["eval_inner_lr_by_shots"] == {1: 0.003}
    assert options["eval_inner_lr"] == 0.01 and options["eval_inner_steps"] == 50
    assert options["inner_optimizer"] == "adam" and options["first_order"] is True
    options.update(shared_head=False, prototype_head=False)  # the test's model has no head
    learner = build_learner("maml", classifier("mlp"), **options)
    assert learner.eval_steps_by_shots == {1: 25} and learner.eval_inner_steps == 50


def test_the_reports_settings_name_the_step_counts_by_shots():
    from metadist.eval.scoring import _settings
    from metadist.eval.settings import EvalOptions

    learner = learner_of(classifier("mlp"), eval_inner_steps_by_shots={1: 2})
    settings = _settings("classification", EvalOptions(), learner)
    assert settings["inner_steps"] == 4 and settings["inner_steps_by_shots"] == {1: 2}
    # eval.inner_steps overrides both, and the report says only it
    settings = _settings("classification", EvalOptions(inner_steps=7), learner)
    assert settings["inner_steps"] == 7 and "inner_steps_by_shots" not in settings
    plain = _settings("classification", EvalOptions(), learner_of(classifier("mlp")))
    assert "inner_steps_by_shots" not in plain
