"""The batched meta-step's fast path: a model's own `batched_forward` (the MLP's batched
matmuls over stacked per-task weights) against the general batched path (`vmap` of
`functional_call`), and the batched second-order meta-gradient against MAML written with
plain `torch.autograd` one task at a time (the learn2learn algorithm)."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from metadist.batch import MetaBatch, TaskSet
from metadist.learners import build_learner
from metadist.models import build_model
from metadist.tasks import build_task_sampler, derive_task_seeds

pytestmark = pytest.mark.usefixtures("one_thread")


def sinusoid_batch(num_tasks=25, seed=0):
    """Finn et al.'s sinusoid tasks: K=10 support and 10 query points each."""
    sampler = build_task_sampler("sinusoid", num_support=10, num_query=10)
    positions = torch.arange(num_tasks).numpy()
    return sampler.sample(positions, derive_task_seeds(seed, 0, positions))


def forecast_like_batch(num_tasks=6, seed=0):
    """Windows `[B, K, 6, 2]` → forecasts `[B, K, 3]` (random, positive levels)."""
    g = torch.Generator().manual_seed(seed)

    def side(k):
        x = torch.rand(num_tasks, k, 6, 2, generator=g) + 1.0
        return TaskSet(x, torch.rand(num_tasks, k, 3, generator=g) + 1.0)

    return MetaBatch(
        support=side(5),
        query=side(4),
        entity_index=torch.full((num_tasks,), -1),
        stratum=torch.zeros(num_tasks, dtype=torch.int64),
        split_time=torch.full((num_tasks,), -1),
    )


def step_outputs(learner, batch):
    """Meta-loss, metrics and meta-gradients of one meta-step."""
    learner.zero_grad()
    out = learner(batch)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in learner.named_parameters()}
    return out, grads


@pytest.mark.parametrize("inner_steps", [1, 2])
@pytest.mark.parametrize(
    ("learner_name", "model_name"),
    [("maml", "mlp"), ("maml", "forecaster"), ("metasgd", "mlp"), ("anil", "mlp")],
)
def test_batched_forward_equals_the_general_batched_path(learner_name, model_name, inner_steps):
    """Same learner, same weights: the model's `batched_forward` and `vmap` of
    `functional_call` give the same losses, metrics and meta-gradients to 1e-6 (float32)."""
    if model_name == "mlp":
        batch = sinusoid_batch()
        shapes, hidden = ((1,), (1,)), (40, 40)
    else:
        batch = forecast_like_batch()
        shapes, hidden = ((6, 2), (3,)), (16, 16)
    results = []
    for native in (True, False):
        torch.manual_seed(0)
        model = build_model(model_name, *shapes, hidden_sizes=hidden)
        learner = build_learner(learner_name, model, inner_steps=inner_steps, inner_lr=0.01)
        assert learner._native_batching
        learner._native_batching = native  # False: the general path, vmap(functional_call)
        results.append(step_outputs(learner, batch))
        assert learner._batched_modes == {True}  # batched, not the per-task loop
    (fast, fast_grads), (general, general_grads) = results
    torch.testing.assert_close(fast.loss, general.loss, rtol=1e-6, atol=1e-6)
    assert fast.metrics.keys() == general.metrics.keys()
    for key in general.metrics:
        torch.testing.assert_close(fast.metrics[key], general.metrics[key], rtol=1e-6, atol=1e-6)
    for key in general_grads:
        torch.testing.assert_close(fast_grads[key], general_grads[key], rtol=1e-6, atol=1e-6)


def per_task_maml_loss(model, batch, inner_steps, inner_lr, first_order=False):
    """MAML's meta-loss the learn2learn way: each task adapted in turn with
    `torch.autograd.grad(..., create_graph=True)`, the query losses averaged."""
    initial = dict(model.named_parameters())
    total = 0.0
    for b in range(batch.num_tasks):
        params = initial
        for _ in range(inner_steps):
            prediction = functional_call(model, params, (batch.support.x[b],))
            loss = F.mse_loss(prediction, batch.support.y[b])
            grads = torch.autograd.grad(loss, list(params.values()), create_graph=not first_order)
            params = {n: p - inner_lr * g for (n, p), g in zip(params.items(), grads, strict=True)}
        total = total + F.mse_loss(
            functional_call(model, params, (batch.query.x[b],)), batch.query.y[b]
        )
    return total / batch.num_tasks


@pytest.mark.parametrize("inner_steps", [1, 3])
def test_batched_second_order_equals_per_task_autograd(inner_steps):
    """Exact second order: the batched meta-gradient is the per-task double backward's
    (float64, 1e-10), and dropping the second-order terms changes it (so it is there)."""
    batch = sinusoid_batch(num_tasks=8)
    batch = replace(
        batch,
        support=TaskSet(batch.support.x.double(), batch.support.y.double()),
        query=TaskSet(batch.query.x.double(), batch.query.y.double()),
    )
    torch.manual_seed(0)
    model = build_model("mlp", (1,), (1,), hidden_sizes=(40, 40)).double()
    learner = build_learner("maml", model, inner_steps=inner_steps, inner_lr=0.1)
    out, grads = step_outputs(learner, batch)
    reference = {}
    for first_order in (False, True):
        model.zero_grad()
        loss = per_task_maml_loss(model, batch, inner_steps, 0.1, first_order)
        loss.backward()
        reference[first_order] = {n: p.grad.clone() for n, p in model.named_parameters()}
        if not first_order:
            torch.testing.assert_close(out.loss, loss, rtol=1e-12, atol=1e-12)
    for name, grad in grads.items():
        key = name.removeprefix("model.")
        torch.testing.assert_close(grad, reference[False][key], rtol=1e-10, atol=1e-12)
    gap = max((reference[False][n] - reference[True][n]).abs().max() for n in reference[True])
    assert gap > 1e-4
