"""MAML++ options of `maml` (and `anil`): the multi-step loss against a hand computation,
per-step per-layer learned inner rates, annealed first order against FOMAML and MAML,
the schedules' meta-step count across a state_dict, and the errors naming the field."""

import pytest
import torch
from torch.func import functional_call

from metadist.batch import MetaBatch, TaskSet
from metadist.learners import build_learner
from metadist.learners.maml_plus import step_loss_weights
from metadist.models import build_model

LR = 0.3


pytestmark = pytest.mark.usefixtures("one_thread")


def make_batch(num_tasks=3, num_support=4, num_query=5, seed=0):
    g = torch.Generator().manual_seed(seed)

    def side(k):
        x = torch.randn(num_tasks, k, 1, generator=g, dtype=torch.float64)
        return TaskSet(x, torch.sin(2 * x) + 0.1 * torch.randn(x.shape, generator=g))

    return MetaBatch(
        support=side(num_support),
        query=side(num_query),
        entity_index=torch.full((num_tasks,), -1),
        stratum=torch.zeros(num_tasks, dtype=torch.int64),
        split_time=torch.full((num_tasks,), -1),
    )


def learner_of(name="maml", **options):
    torch.manual_seed(0)
    model = build_model("mlp", (1,), (1,), hidden_sizes=(5,), activation="tanh").double()
    return build_learner(name, model, inner_lr=LR, **options)


def meta_gradient(learner, batch):
    learner.zero_grad()
    out = learner(batch)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in learner.named_parameters()}


def by_hand(model, batch, weights):
    """Σ_i w_i · query loss after inner step i+1, second order, averaged over tasks, and
    its gradient w.r.t. the model's parameters: plain autograd, one task at a time."""
    start = dict(model.named_parameters())
    total = 0.0
    for b in range(batch.num_tasks):
        fast, task = start, 0.0
        for weight in weights:
            support = functional_call(model, fast, (batch.support.x[b],))
            loss = ((support - batch.support.y[b]) ** 2).mean()
            grads = torch.autograd.grad(loss, list(fast.values()), create_graph=True)
            fast = {n: p - LR * g for (n, p), g in zip(fast.items(), grads, strict=True)}
            query = functional_call(model, fast, (batch.query.x[b],))
            task = task + weight * ((query - batch.query.y[b]) ** 2).mean()
        total = total + task / batch.num_tasks
    grads = torch.autograd.grad(total, list(start.values()))
    return total.detach(), {"model." + n: g for n, g in zip(start, grads, strict=True)}


def test_step_loss_weights_start_equal_and_anneal_to_the_last():
    assert step_loss_weights(3, 0, 10) == pytest.approx([1 / 3] * 3)
    assert step_loss_weights(3, 5, 10) == pytest.approx([1 / 6, 1 / 6, 2 / 3])
    late = step_loss_weights(4, 99, 100)
    assert late[:3] == pytest.approx([0.03 / 4] * 3)  # the paper's floor
    assert sum(late) == pytest.approx(1.0)
    assert step_loss_weights(3, 10, 10) is None  # from meta-step T on: the last alone
    assert step_loss_weights(1, 0, 10) is None


@pytest.mark.parametrize("vectorize", [True, False])  # batched, and the per-task loop
def test_multi_step_loss_is_the_weighted_query_losses_of_every_step(vectorize):
    batch = make_batch()
    learner = learner_of(inner_steps=2, multi_step_loss_steps=4, vectorize=vectorize)
    for meta_step, weights in ((0, [0.5, 0.5]), (1, [0.375, 0.625]), (2, [0.25, 0.75])):
        assert learner.meta_steps.value == meta_step
        loss, grads = meta_gradient(learner, batch)  # counts one meta-step
        expected_loss, expected = by_hand(learner.model, batch, weights)
        torch.testing.assert_close(loss, expected_loss)
        for key, value in expected.items():
            torch.testing.assert_close(grads[key], value)
    plain_loss, plain = by_hand(learner.model, batch, [0.0, 1.0])
    assert (grads["model.head.weight"] - plain["model.head.weight"]).abs().max() > 1e-4
    learner(batch)  # meta-step 3; from 4 on the meta-loss is plain MAML's
    loss, grads = meta_gradient(learner, batch)
    torch.testing.assert_close(loss, plain_loss)
    for key, value in plain.items():
        torch.testing.assert_close(grads[key], value)


def test_multi_step_loss_only_in_training_and_the_metrics_stay_the_last_steps():
    batch = make_batch()
    learner = learner_of(inner_steps=2, multi_step_loss_steps=4)
    plain = learner_of(inner_steps=2)
    out, reference = learner(batch), plain(batch)
    torch.testing.assert_close(
        out.metrics["query_loss_after"], reference.metrics["query_loss_after"]
    )
    assert (out.loss - reference.loss).abs() > 1e-4
    learner.eval()
    with torch.no_grad():
        torch.testing.assert_close(learner(batch).loss, reference.loss.detach())
    assert learner.meta_steps.value == 1  # evaluation counts no meta-step


def test_per_layer_inner_rates_are_a_steps_by_layers_parameter():
    learner = learner_of(inner_steps=3, learn_inner_lr=True, inner_lr_per_layer=True)
    names = [n for n, _ in learner.model.named_parameters()]
    assert learner.inner_lrs.shape == (3, len(names))
    _, grads = meta_gradient(learner, make_batch())
    assert (grads["inner_lrs"] != 0).all()  # every step and layer is learned
    # Each entry is that step's rate for that layer: a layer whose rates are 0 stays put.
    frozen = names.index("head.weight")
    with torch.no_grad():
        learner.inner_lrs.fill_(0.2)
        learner.inner_lrs[:, frozen] = 0.0
        adapted = learner.adapt(make_batch().support)
    start = dict(learner.model.named_parameters())
    for name in names:
        moved = (adapted[name] - start[name]).abs().max()
        assert (moved == 0) if name == "head.weight" else (moved > 0), name
    anil = learner_of("anil", inner_steps=2, learn_inner_lr=True, inner_lr_per_layer=True)
    assert anil.inner_lrs.shape == (2, 2)  # the head's weight and bias only


def test_per_layer_rates_match_a_hand_computed_step():
    learner = learner_of(inner_steps=1, learn_inner_lr=True, inner_lr_per_layer=True)
    names = [n for n, _ in learner.model.named_parameters()]
    rates = torch.linspace(0.05, 0.4, len(names), dtype=torch.float64)
    with torch.no_grad():
        learner.inner_lrs.copy_(rates[None])
    batch = make_batch(num_tasks=1)
    adapted = learner.adapt(batch.support)
    params = dict(learner.model.named_parameters())
    loss = ((learner.model(batch.support.x[0]) - batch.support.y[0]) ** 2).mean()
    grads = torch.autograd.grad(loss, list(params.values()))
    for i, (name, grad) in enumerate(zip(names, grads, strict=True)):
        torch.testing.assert_close(adapted[name][0], (params[name] - rates[i] * grad).detach())


def test_first_order_until_the_switch_then_second_order():
    batch = make_batch()
    annealed = learner_of(inner_steps=2, first_order_steps=2)
    _, fomaml = meta_gradient(learner_of(inner_steps=2, first_order=True), batch)
    _, maml = meta_gradient(learner_of(inner_steps=2), batch)
    difference = max((fomaml[k] - maml[k]).abs().max() for k in maml)
    assert difference > 1e-4  # the two orders differ here: the test can fail
    for _ in range(2):
        _, grads = meta_gradient(annealed, batch)
        for key in fomaml:
            torch.testing.assert_close(grads[key], fomaml[key])
    _, grads = meta_gradient(annealed, batch)
    for key in maml:
        torch.testing.assert_close(grads[key], maml[key])


def test_the_schedules_resume_from_the_state_dict():
    batch = make_batch()
    trained = learner_of(inner_steps=2, first_order_steps=3, multi_step_loss_steps=5)
    for _ in range(3):
        trained(batch)
    state = trained.state_dict()
    assert int(state["meta_steps.count"]) == 3
    fresh = learner_of(inner_steps=2, first_order_steps=3, multi_step_loss_steps=5)
    fresh.load_state_dict(state)
    assert fresh.meta_steps.value == 3
    loss, grads = meta_gradient(fresh, batch)
    expected_loss, expected = meta_gradient(trained, batch)
    torch.testing.assert_close(loss, expected_loss)
    for key in expected:
        torch.testing.assert_close(grads[key], expected[key])
    assert "meta_steps.count" not in learner_of(inner_steps=2).state_dict()  # plain MAML's keys


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"inner_lr_per_layer": True}, "inner_lr_per_layer"),
        ({"multi_step_loss_steps": -1}, "multi_step_loss_steps"),
        ({"multi_step_loss_steps": 10, "inner_steps": 0}, "multi_step_loss_steps"),
        ({"first_order_steps": -2}, "first_order_steps"),
        ({"first_order_steps": 5, "first_order": True}, "first_order_steps"),
        ({"first_order_steps": "soon"}, "first_order_steps"),
    ],
)
def test_bad_options_name_the_field(options, field):
    model = build_model("mlp", (1,), (1,))
    with pytest.raises(ValueError, match=field):
        build_learner("maml", model, **options)
