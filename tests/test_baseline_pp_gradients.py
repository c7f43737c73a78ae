"""Baseline++'s written-out gradients and fused Adam train each episode's cosine
classifier as autograd and `torch.optim.Adam` do, episode by episode."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional

from metadist.eval import baseline_pp
from metadist.eval.baseline_pp import cosine_classifier_scores

pytestmark = pytest.mark.usefixtures("one_thread")


def _reference(support, support_y, query, num_ways, steps, lr=0.01, scale=10.0):
    """One episode's Baseline++ as Chen et al. write it: autograd through the cosine
    logits and cross-entropy, `torch.optim.Adam` (its default implementation)."""
    one_hot = functional.one_hot(support_y, num_ways).to(support.dtype)
    weights = functional.normalize(one_hot.T @ support, dim=-1).clone().requires_grad_(True)
    log_scale = torch.tensor(math.log(scale), dtype=support.dtype, requires_grad=True)
    optimizer = torch.optim.Adam([weights, log_scale], lr=lr)

    def logits(features):
        return log_scale.exp() * (features @ functional.normalize(weights, dim=-1).T)

    for _ in range(steps):
        optimizer.zero_grad()
        functional.cross_entropy(logits(support), support_y).backward()
        optimizer.step()
    with torch.no_grad():
        return logits(query)


@pytest.mark.parametrize("steps", [1, 100])
def test_written_out_gradients_equal_autograd_and_torch_adam(steps):
    torch.manual_seed(0)
    num_tasks, num_ways, shots, queries, width = 5, 4, 3, 6, 16
    backbone = torch.nn.Sequential(torch.nn.Flatten(-2), torch.nn.Linear(12, width)).eval()
    support_y = torch.arange(num_ways).repeat_interleave(shots).repeat(num_tasks, 1)
    support_x = torch.randn(num_tasks, num_ways * shots, 6, 2) + support_y[..., None, None]
    query_x = torch.randn(num_tasks, queries, 6, 2) * 2
    scores = cosine_classifier_scores(
        backbone, support_x, support_y, query_x, num_ways, steps=steps
    )
    for b in range(num_tasks):
        with torch.no_grad():
            support = functional.normalize(backbone(support_x[b]).double(), dim=-1)
            query = functional.normalize(backbone(query_x[b]).double(), dim=-1)
        expected = _reference(support, support_y[b], query, num_ways, steps)
        torch.testing.assert_close(scores[b], expected, rtol=1e-9, atol=1e-9)


def test_gradients_equal_autograd_where_a_weight_is_below_normalizes_eps():
    torch.manual_seed(1)
    support = functional.normalize(torch.randn(2, 6, 8, dtype=torch.float64), dim=-1)
    one_hot = functional.one_hot(torch.arange(3).repeat(2).repeat(2, 1), 3).double()
    weights = torch.randn(2, 3, 8, dtype=torch.float64)
    weights[1, 2] = 1e-14  # a way's weight vector (almost) zero: normalize divides by eps
    log_scale = torch.tensor([0.5, 2.0], dtype=torch.float64)
    grads = baseline_pp._gradients(support, one_hot, weights, log_scale)
    leaves = [weights.clone().requires_grad_(True), log_scale.clone().requires_grad_(True)]
    logits = leaves[1].exp()[:, None, None] * (
        support @ functional.normalize(leaves[0], dim=-1).transpose(1, 2)
    )
    loss = functional.cross_entropy(
        logits.reshape(-1, 3), one_hot.argmax(-1).reshape(-1), reduction="sum"
    )
    expected = torch.autograd.grad(loss / support.shape[1], leaves)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
