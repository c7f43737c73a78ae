"""Baseline++ (Chen et al. 2019, "A Closer Look at Few-shot Classification"): a frozen
pretrained backbone and, for each episode, a cosine-similarity classifier fine-tuned on
its support set.

The classifier scores way c as `s · cos(f(x), w_c)`: `f` the backbone's features, `w_c`
one weight vector per way and `s` a learned scale. Each episode gets its own weights and
scale, all episodes of a batch trained at once as `[B, N, D]` and `[B]` tensors (the loss
is a sum over episodes and Adam works element by element, so each episode's training is
independent of the others in its batch).

Differences from the paper, stated: the backbone is the one `pretrain_embedding` trains
(with a linear head, where Chen et al. pretrain Baseline++ with a cosine head too); the
weights start at the ways' normalised mean support features ("weight imprinting", Qi et
al. 2018) instead of at random, so the classifier starts as the cosine nearest centroid
and its predictions depend on nothing but the episode; Adam on the whole support set in
place of SGD on mini-batches of 4.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional

from metadist.train.adam import Adam, has_fused_adam

__all__ = ["cosine_classifier_scores"]

# The fine-tuning schedule of Chen et al. (100 steps at 0.01) and their scale's order of
# magnitude; the scale is learned from there.
STEPS = 100
LR = 0.01
INITIAL_SCALE = 10.0
_NORMALIZE_EPS = 1e-12  # torch.nn.functional.normalize's


def cosine_classifier_scores(
    backbone: nn.Module,
    support_x: Tensor,
    support_y: Tensor,
    query_x: Tensor,
    num_ways: int,
    *,
    steps: int = STEPS,
    lr: float = LR,
    initial_scale: float = INITIAL_SCALE,
) -> Tensor:
    """Baseline++ scores `[B, Q, N]` of the query examples of B episodes.

    Args:
        backbone: the frozen feature extractor, `[M, ...] -> [M, D]` (not changed).
        support_x: `[B, S, ...]`; support_y: `[B, S]` int64 in `[0, N)`;
        query_x: `[B, Q, ...]`.
        num_ways: N.
        steps: Adam steps on each support set (0: the cosine nearest centroid, scaled).
        lr: Adam's learning rate.
        initial_scale: the scale s before fine-tuning.

    Raises:
        ValueError: steps < 0, lr <= 0 or initial_scale <= 0.
    """
    if int(steps) < 0 or not lr > 0 or not initial_scale > 0:
        raise ValueError(
            f"Baseline++: steps must be >= 0 and lr, initial_scale > 0, got steps={steps}, "
            f"lr={lr}, initial_scale={initial_scale}"
        )
    support = _features(backbone, support_x)  # [B, S, D], unit length
    query = _features(backbone, query_x)
    one_hot = functional.one_hot(support_y.long(), num_ways).to(support.dtype)  # [B, S, N]
    imprinted = one_hot.transpose(1, 2) @ support  # [B, N, D]: sums of the ways' features
    weights = functional.normalize(imprinted, dim=-1)
    log_scale = torch.full((support.shape[0],), math.log(initial_scale), dtype=support.dtype)
    # torch.optim.Adam's update (its fused kernel: one pass over each tensor a step)
    fused = has_fused_adam(support.device, support.dtype)
    optimizer = Adam([weights, log_scale], lr=lr, fused=fused, foreach=not fused)
    with torch.no_grad():
        for _ in range(int(steps)):
            optimizer.step(_gradients(support, one_hot, weights, log_scale))
        return _cosine_logits(query, weights, log_scale)


def _gradients(
    support: Tensor, one_hot: Tensor, weights: Tensor, log_scale: Tensor
) -> tuple[Tensor, Tensor]:
    """The gradients of the episodes' summed mean cross-entropy on their support sets
    w.r.t. `weights [B, N, D]` and `log_scale [B]`, written out (what autograd gives
    through `_cosine_logits` and `cross_entropy`, without building a graph).

    With d = w / |w| (`normalize`), c = f·d, s = exp(log_scale), logits z = s·c and
    g = dL/dz = (softmax(z) − one_hot) / S: dL/dlog_scale = s·Σ g·c, dL/dd = s·gᵀf and
    dL/dw = (dL/dd − d (d·dL/dd)) / |w|.
    """
    norms = weights.norm(dim=-1, keepdim=True)  # [B, N, 1]
    directions = weights / norms.clamp_min(_NORMALIZE_EPS)
    cosines = support @ directions.transpose(1, 2)  # [B, S, N]
    scale = log_scale.exp()[:, None, None]
    logits = scale * cosines
    # the softmax written out: `torch.softmax` over a last dim of a few ways is slower
    exp = logits.sub_(logits.amax(-1, keepdim=True)).exp_()
    grad_logits = exp.div_(exp.sum(-1, keepdim=True)).sub_(one_hot).div_(support.shape[1])
    grad_log_scale = (grad_logits * cosines).sum((1, 2)).mul_(scale[:, 0, 0])
    grad_directions = (grad_logits.transpose(1, 2) @ support).mul_(scale)  # [B, N, D]
    radial = (directions * grad_directions).sum(-1, keepdim=True)
    tangent = grad_directions - directions * radial
    # normalize's own backward where |w| is below its eps (d = w / eps there)
    grad_weights = torch.where(
        norms > _NORMALIZE_EPS, tangent / norms, grad_directions / _NORMALIZE_EPS
    )
    return grad_weights, grad_log_scale


def _features(backbone: nn.Module, x: Tensor) -> Tensor:
    """`[B, M, D]` unit-length float64 features of `x [B, M, ...]` (no gradient)."""
    with torch.no_grad():
        flat = backbone(x.reshape(-1, *x.shape[2:])).to(torch.float64)
    return functional.normalize(flat.reshape(x.shape[0], x.shape[1], -1), dim=-1)


def _cosine_logits(features: Tensor, weights: Tensor, log_scale: Tensor) -> Tensor:
    """`s · cos(f, w_c)`: `[B, M, N]` from unit features `[B, M, D]`, weights `[B, N, D]`."""
    directions = functional.normalize(weights, dim=-1)
    return log_scale.exp()[:, None, None] * (features @ directions.transpose(1, 2))
