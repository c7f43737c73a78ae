"""MAML's `inner_optimizer: adam` (and `eval_inner_optimizer` / `eval_inner_lr`): each
task's inner steps are `torch.optim.Adam`'s on its own support loss, the way labels are
followed, the meta-gradient flows first order, and bad options are named."""

import copy

import pytest
import torch
import torch.nn.functional as F
from test_shared_head import PERMUTATION, classifier, episodes, relabelled

from metadist.learners import build_learner

pytestmark = pytest.mark.usefixtures("one_thread")


def adam_learner(model, **options):
    defaults = {
        "loss": "cross_entropy",
        "inner_steps": 3,
        "inner_lr": 0.01,
        "first_order": True,
        "inner_optimizer": "adam",
    }
    return build_learner("maml", model, **{**defaults, **options})


def torch_adam(model, x, y, steps, lr):
    """Every parameter of a copy of `model` after `steps` `torch.optim.Adam` steps on the
    mean cross-entropy of `(x, y)`: the independent computation."""
    model = copy.deepcopy(model).double()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x.double()), y).backward()
        optimizer.step()
    return dict(model.named_parameters())


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("vectorize", [True, False])
def test_each_tasks_steps_equal_torch_adams(vectorize, steps):
    model = classifier("mlp")
    learner = adam_learner(copy.deepcopy(model).double(), vectorize=vectorize)
    batch = episodes(dtype=torch.float64)
    with torch.no_grad():
        adapted = learner.adapt(batch.support, steps=steps)
    for task in range(batch.support.x.shape[0]):
        x, y = batch.support.x[task], batch.support.y[task]
        expected = torch_adam(model, x, y, steps, lr=0.01)
        for name, value in expected.items():
            torch.testing.assert_close(adapted[name][task], value.detach(), rtol=1e-9, atol=1e-12)
        moved = max(
            (adapted[n][task] - p).abs().max() for n, p in model.double().named_parameters()
        )
        assert moved > 1e-3  # the steps did something: not a trivial equality


def test_eval_mode_options_apply_in_eval_mode_only():
    model = classifier("mlp").double()
    learner = build_learner(
        "maml",
        copy.deepcopy(model),
        loss="cross_entropy",
        inner_steps=2,
        inner_lr=0.5,
        eval_inner_optimizer="adam",
        eval_inner_lr=0.003,
    )
    batch = episodes(num_tasks=1, dtype=torch.float64)
    x, y = batch.support.x[0], batch.support.y[0]
    learner.eval()
    with torch.no_grad():
        evaluated = learner.adapt(batch.support)
    for name, value in torch_adam(model, x, y, 2, lr=0.003).items():
        torch.testing.assert_close(evaluated[name][0], value.detach(), rtol=1e-9, atol=1e-12)
    learner.train()
    with torch.no_grad():
        trained = learner.adapt(batch.support, steps=1)
    plain = copy.deepcopy(model)
    F.cross_entropy(plain(x), y).backward()
    for name, p in plain.named_parameters():  # one SGD step at inner_lr
        torch.testing.assert_close(trained[name][0], p.detach() - 0.5 * p.grad)


@pytest.mark.parametrize(
    ("prototype_head", "dtype"),
    [(True, torch.float32), (True, torch.float64), (False, torch.float64)],
)
def test_relabelling_the_ways_permutes_the_predictions(prototype_head, dtype):
    """Without the prototype rows (all rows equal before the first step) the body's first
    gradient is 0 in exact arithmetic and Adam steps by the sign of its round-off, which
    depends on the way order: invariant to 1e-5 in float64, not in float32 (documented
    with the option); with them (the recipes), in float32 too."""
    options = {"prototype_head": True, "prototype_scale": 10.0} if prototype_head else {}
    model = classifier().to(dtype)
    learner = adam_learner(model, shared_head=True, inner_steps=5, **options)
    learner.eval()
    batch = episodes(dtype=dtype)
    with torch.no_grad():
        logits = learner.predict(learner.adapt(batch.support), batch.query.x)
        again = relabelled(batch, PERMUTATION)
        permuted = learner.predict(learner.adapt(again.support), again.query.x)
    torch.testing.assert_close(permuted[..., PERMUTATION], logits, rtol=0, atol=1e-5)
    assert logits.std(-1).mean() > 1e-2  # the ways are told apart
    assert torch.equal(permuted.argmax(-1), PERMUTATION[logits.argmax(-1)])


def test_meta_training_with_adam_is_first_order_and_reaches_every_parameter():
    learner = adam_learner(classifier(), shared_head=True, prototype_head=True)
    out = learner(episodes())
    out.loss.backward()
    for name, p in learner.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"inner_optimizer": "rmsprop"}, "inner_optimizer must be one of ('sgd', 'adam')"),
        ({"eval_inner_optimizer": "lbfgs"}, "eval_inner_optimizer must be one of"),
        ({"first_order": False}, "inner_optimizer 'adam' needs first_order: true"),
        ({"eval_inner_lr": 0}, "eval_inner_lr must be a number > 0 or null"),
        ({"eval_inner_lr": 0.1, "learn_inner_lr": True}, "eval_inner_lr has no effect"),
    ],
)
def test_bad_options_are_named_in_one_line(options, message):
    with pytest.raises(ValueError) as raised:
        adam_learner(classifier(), **options)
    text = str(raised.value)
    assert text.startswith("learner 'maml': ") and message in text
    assert "\n" not in text
