"""Meta-Baseline with an Adam-tuned head: the adapted class weights against each task
fine-tuned alone by `torch.optim.Adam`, the step sizes' meta-gradient against finite
differences, label-order invariance, no steps = Meta-Baseline, and the options' errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_metabaseline import episodes
from test_metabaseline_ft import in_float64

from metadist.learners import build_learner, get_learner
from metadist.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


def learner_and_model(dtype=torch.float32, **options):
    torch.manual_seed(0)
    model = build_model("mlp", (6, 2), (4,), hidden_sizes=(8,)).to(dtype)
    return build_learner("metabaseline_adam", model, **options), model


def set_sizes(learner, sizes):
    with torch.no_grad():
        learner.log_inner_lrs.copy_(torch.tensor(sizes, dtype=torch.float64).log())


def adam_by_hand(model, scale, sizes, support_x, support_y, num_ways):
    """One task's weights `[N, D]`: unit-length prototypes, then `torch.optim.Adam` on them, its
    lr set to each step's size, on the mean support cross-entropy of
    `scale · cos(f(x), w_c)` (torch's own cosine similarity)."""
    with torch.no_grad():
        features = model(support_x)
    weights = torch.stack([features[support_y == c].mean(0) for c in range(num_ways)])
    weights = (weights / weights.norm(dim=-1, keepdim=True)).requires_grad_(True)
    optimizer = torch.optim.Adam([weights], lr=sizes[0], foreach=False)
    for size in sizes:
        optimizer.param_groups[0]["lr"] = size
        optimizer.zero_grad()
        logits = scale * F.cosine_similarity(features[:, None, :], weights[None], dim=-1)
        F.cross_entropy(logits, support_y).backward()
        optimizer.step()
    return weights.detach()


def test_the_weights_are_the_prototypes_after_torch_adam_on_each_support_set():
    learner, model = learner_and_model(dtype=torch.float64, inner_steps=4)
    sizes = [0.05, 0.02, 0.1, 0.03]
    set_sizes(learner, sizes)
    batch = in_float64(episodes(num_shots=3))
    with torch.no_grad():
        weights = learner.adapt(batch.support)["prototypes"]
        logits = learner.predict({"prototypes": weights}, batch.query.x)
    for b in range(3):
        expected = adam_by_hand(model, 10.0, sizes, batch.support.x[b], batch.support.y[b], 3)
        torch.testing.assert_close(weights[b], expected, rtol=1e-9, atol=1e-9)
        query = model(batch.query.x[b]).detach()
        by_hand = 10.0 * F.cosine_similarity(query[:, None, :], expected[None], dim=-1)
        torch.testing.assert_close(logits[b], by_hand, rtol=1e-9, atol=1e-9)
    # Adam's first step moves every element by about its size: not a trivial pass
    prototypes = learner.adapt(batch.support, steps=0)["prototypes"]
    assert (weights - F.normalize(prototypes, dim=-1)).abs().max() > 0.05


def test_adam_moves_the_head_where_the_support_gradient_is_tiny():
    """At one shot the imprinted head already fits the support: an SGD step
    (`metabaseline_ft`) barely turns it, Adam's normalised step moves each element of the
    unit-length weights by about its size."""
    batch = episodes(num_shots=1)
    adam, model = learner_and_model(inner_steps=1, inner_lr=0.01)
    sgd = build_learner("metabaseline_ft", model, inner_steps=1, inner_lr=0.01)
    with torch.no_grad():
        start = adam.adapt(batch.support, steps=0)["prototypes"]
        by_adam = adam.adapt(batch.support)["prototypes"]
        by_sgd = sgd.adapt(batch.support)["prototypes"]
    moved = (by_adam - F.normalize(start, dim=-1)).abs()
    moved = moved[moved > 0]
    torch.testing.assert_close(moved, torch.full_like(moved, 0.01), rtol=1e-2, atol=0)

    def turn(weights):  # 1 - cos(start, weights), the largest over ways and tasks
        return (1 - F.cosine_similarity(start, weights, dim=-1)).max()

    assert turn(by_sgd) < 0.1 * turn(by_adam)


def _query_loss(learner, batch, sizes):
    set_sizes(learner, sizes)
    return learner(batch).loss


@pytest.mark.parametrize(("first_order", "steps"), [(True, 1), (False, 3)])
def test_the_sizes_meta_gradient_matches_finite_differences(first_order, steps):
    """Exact where it should be: second order through every step, and first order with
    one step (its direction does not depend on the size)."""
    learner, _ = learner_and_model(dtype=torch.float64, inner_steps=steps, first_order=first_order)
    batch = in_float64(episodes(num_shots=2, seed=3))
    sizes = [0.3, 0.1, 0.2][:steps]
    learner.zero_grad()
    _query_loss(learner, batch, sizes).backward()
    analytic = learner.log_inner_lrs.grad.clone()
    assert analytic.abs().max() > 1e-6
    eps = 1e-6
    for i in range(steps):
        with torch.no_grad():
            up = [s * math.exp(eps) if j == i else s for j, s in enumerate(sizes)]
            down = [s * math.exp(-eps) if j == i else s for j, s in enumerate(sizes)]
            difference = (_query_loss(learner, batch, up) - _query_loss(learner, batch, down)) / (
                2 * eps
            )
        torch.testing.assert_close(analytic[i], difference, rtol=1e-5, atol=1e-8)


def test_first_order_drops_the_second_order_terms_of_the_embedding():
    batch = episodes()
    grads = {}
    for first_order in (False, True):
        learner, model = learner_and_model(first_order=first_order, inner_steps=3)
        learner(batch).loss.backward()
        grads[first_order] = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert learner.log_inner_lrs.grad is not None and learner.scale.grad is not None
    assert (grads[True] - grads[False]).norm() > 1e-4 * grads[False].norm()


def test_more_steps_than_sizes_repeat_the_last_and_it_is_an_embedding_learner():
    learner, model = learner_and_model(dtype=torch.float64, inner_steps=1, inner_lr=0.04)
    batch = in_float64(episodes())
    with torch.no_grad():
        weights = learner.adapt(batch.support, steps=3)["prototypes"]
    expected = adam_by_hand(model, 10.0, [0.04] * 3, batch.support.x[0], batch.support.y[0], 3)
    torch.testing.assert_close(weights[0], expected, rtol=1e-9, atol=1e-9)
    assert get_learner("metabaseline_adam").has_inner_loop is False  # no "unadapted" row
    frozen, _ = learner_and_model(learn_inner_lr=False)
    assert not frozen.log_inner_lrs.requires_grad


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"inner_steps": -1}, "inner_steps"),
        ({"inner_lr": 0.0}, "inner_lr"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"eps": 0.0}, "eps"),
        ({"init_scale": 0.0}, "init_scale"),
    ],
)
def test_bad_options_name_the_field(options, field):
    with pytest.raises(ValueError, match=f"learner 'metabaseline_adam': {field}"):
        learner_and_model(**options)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        learner_and_model()[0].adapt(episodes().support, steps=-1)


def test_second_order_meta_gradient_is_finite_where_a_feature_is_off_for_a_whole_task():
    """An embedding ending in a ReLU has features that are 0 on a whole support set, so
    their head gradients are exactly 0: sqrt's backward at v = 0 made the second-order
    meta-gradient NaN everywhere (0 · ∞)."""
    from torch import nn

    class ReluEmbedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = build_model("mlp", (6, 2), (4,), hidden_sizes=(8,))

        def forward(self, x):
            return torch.relu(self.net(x))

    torch.manual_seed(0)
    model = ReluEmbedding().double()
    batch = in_float64(episodes())
    with torch.no_grad():
        assert (model(batch.support.x) == 0).all(1).any()  # a feature off for a whole task
    learner = build_learner("metabaseline_adam", model, inner_steps=3, first_order=False)
    learner(batch).loss.backward()
    grads = torch.cat([p.grad.flatten() for p in learner.parameters() if p.grad is not None])
    assert torch.isfinite(grads).all() and grads.abs().sum() > 0
