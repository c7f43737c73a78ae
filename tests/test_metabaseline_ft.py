"""Meta-Baseline with a fine-tuned head: the adapted class weights against an independent
per-task computation, the meta-gradient of the step sizes against finite differences,
no steps = Meta-Baseline, and the options' errors."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_metabaseline import episodes

from metadist.batch import TaskSet
from metadist.learners import build_learner, get_learner
from metadist.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


def learner_and_model(dtype=torch.float32, **options):
    torch.manual_seed(0)
    model = build_model("mlp", (6, 2), (4,), hidden_sizes=(8,)).to(dtype)
    return build_learner("metabaseline_ft", model, **options), model


def in_float64(batch):
    return dataclasses.replace(
        batch,
        support=TaskSet(batch.support.x.double(), batch.support.y),
        query=TaskSet(batch.query.x.double(), batch.query.y),
    )


def fine_tuned_by_hand(model, scale, rates, support_x, support_y, num_ways):
    """One task's weights `[N, D]`: prototypes, then plain SGD steps on the mean support
    cross-entropy of `scale · cos(f(x), w_c)`, with torch's own cosine similarity."""
    with torch.no_grad():
        features = model(support_x)
    weights = torch.stack([features[support_y == c].mean(0) for c in range(num_ways)])
    for rate in rates:
        weights = weights.detach().requires_grad_(True)
        logits = scale * F.cosine_similarity(features[:, None, :], weights[None], dim=-1)
        (gradient,) = torch.autograd.grad(F.cross_entropy(logits, support_y), weights)
        weights = weights - rate * gradient
    return weights.detach()


def test_the_weights_are_the_prototypes_after_sgd_on_the_support_loss():
    learner, model = learner_and_model(dtype=torch.float64, inner_steps=3, inner_lr=0.7)
    with torch.no_grad():
        learner.inner_lrs.copy_(torch.tensor([0.7, 0.4, 1.3], dtype=torch.float64))
    batch = in_float64(episodes(num_shots=3))
    with torch.no_grad():
        weights = learner.adapt(batch.support)["prototypes"]
        logits = learner.predict({"prototypes": weights}, batch.query.x)
    for b in range(3):
        expected = fine_tuned_by_hand(
            model, 10.0, [0.7, 0.4, 1.3], batch.support.x[b], batch.support.y[b], 3
        )
        torch.testing.assert_close(weights[b], expected, rtol=1e-9, atol=1e-9)
        query = model(batch.query.x[b]).detach()
        by_hand = 10.0 * F.cosine_similarity(query[:, None, :], expected[None], dim=-1)
        torch.testing.assert_close(logits[b], by_hand, rtol=1e-9, atol=1e-9)
    # the steps moved the weights: the test would pass trivially otherwise
    prototypes = learner.adapt(batch.support, steps=0)["prototypes"]
    assert (weights - prototypes).abs().max() > 1e-3


def _query_loss(learner, batch, rates):
    with torch.no_grad():
        learner.inner_lrs.copy_(rates)
    return learner(batch).loss


def test_the_step_sizes_meta_gradient_matches_finite_differences():
    learner, _ = learner_and_model(dtype=torch.float64, inner_steps=2, inner_lr=0.8)
    batch = in_float64(episodes(num_shots=2, seed=3))
    rates = torch.tensor([0.8, 0.5], dtype=torch.float64)
    learner.zero_grad()
    _query_loss(learner, batch, rates).backward()
    analytic = learner.inner_lrs.grad.clone()
    assert analytic.abs().max() > 1e-6
    eps = 1e-6
    for i in range(2):
        step = torch.zeros(2, dtype=torch.float64)
        step[i] = eps
        with torch.no_grad():
            plus = _query_loss(learner, batch, rates + step)
            minus = _query_loss(learner, batch, rates - step)
        torch.testing.assert_close(analytic[i], (plus - minus) / (2 * eps), rtol=1e-5, atol=1e-8)


def test_first_order_drops_the_second_order_terms_of_the_embedding():
    batch = episodes()
    grads = {}
    for first_order in (False, True):
        learner, model = learner_and_model(first_order=first_order)
        learner(batch).loss.backward()
        grads[first_order] = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert learner.inner_lrs.grad is not None
    assert (grads[True] - grads[False]).norm() > 1e-4 * grads[False].norm()


def test_more_steps_than_rates_repeat_the_last_rate_and_it_is_an_embedding_learner():
    learner, model = learner_and_model(dtype=torch.float64, inner_steps=1, inner_lr=0.6)
    batch = episodes()
    x = batch.support.x.double()
    with torch.no_grad():
        weights = learner.adapt(type(batch.support)(x, batch.support.y), steps=3)["prototypes"]
    expected = fine_tuned_by_hand(model, 10.0, [0.6] * 3, x[0], batch.support.y[0], 3)
    torch.testing.assert_close(weights[0], expected, rtol=1e-9, atol=1e-9)
    assert get_learner("metabaseline_ft").has_inner_loop is False  # no "unadapted" row


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"inner_steps": -1}, "inner_steps"),
        ({"inner_lr": -0.1}, "inner_lr"),
        ({"init_scale": 0.0}, "init_scale"),
    ],
)
def test_bad_options_name_the_field(options, field):
    with pytest.raises(ValueError, match=f"learner 'metabaseline_ft': {field}"):
        learner_and_model(**options)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        learner_and_model()[0].adapt(episodes().support, steps=-1)
