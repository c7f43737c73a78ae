"""Adam's update (Kingma & Ba 2015) as plain tensor arithmetic, for the inner loops that
step by it: `metabaseline_adam`'s head, `metabaseline_tune`'s network and MAML's
`inner_optimizer: adam`.

The arithmetic is `torch.optim.Adam`'s: with `g` the gradient at step t (from 0),
`m ← β1 m + (1 − β1) g`, `v ← β2 v + (1 − β2) g²`, and the step direction
`(m / c1) / (√v / √c2 + ε)` with `c1 = 1 − β1^(t+1)`, `c2 = 1 − β2^(t+1)`; the caller
scales it by the step size. The moments are whatever shape the gradient has, so a
batched inner loop's `[B, ...]` gradients keep one Adam state per task.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

Moments = tuple[Tensor, Tensor]
BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults
EPS = 1e-8


def adam_direction(
    gradient: Tensor,
    moments: Moments,
    step: int,
    betas: tuple[float, float] = BETAS,
    eps: float = EPS,
) -> tuple[Tensor, Moments]:
    """Adam's step direction at `step` (from 0) and the updated `(first, second)` moments.

    Args:
        gradient: any shape.
        moments: `(m, v)` of the gradient's shape (zeros before the first step).
        step: the step's index, for the bias corrections.
        betas: `(β1, β2)`.
        eps: `ε`.

    Returns:
        `(direction, (m, v))`, each of the gradient's shape.
    """
    beta1, beta2 = float(betas[0]), float(betas[1])
    first = beta1 * moments[0] + (1 - beta1) * gradient
    second = beta2 * moments[1] + (1 - beta2) * gradient * gradient
    correction1 = 1 - beta1 ** (step + 1)
    correction2 = 1 - beta2 ** (step + 1)
    # √v with a gradient of 0 where v = 0 (a support gradient exactly 0, as a ReLU feature
    # off for a whole task gives): sqrt's backward there is 0 · ∞, NaN in second order
    positive = second > 0
    root = torch.where(positive, torch.where(positive, second, 1.0).sqrt(), 0.0)
    denominator = root / math.sqrt(correction2) + eps
    return first / correction1 / denominator, (first, second)


def adam_steps(
    fast: dict[str, Tensor],
    step_sizes: list[Tensor | float],
    grads: tuple[Tensor, ...],
    moments: list[Moments] | None,
    step: int,
) -> tuple[dict[str, Tensor], list[Moments]]:
    """`param − step_size · direction` for every parameter of `fast` (in order), each
    direction Adam's from its own moments (`None`: the first step, zeros).

    The directions are constants of any outer graph (first order through Adam: the
    meta-gradient reaches the parameters through `param` and learned step sizes through
    `−step_size · direction`, never through the normalisation, whose derivative is
    unbounded where a gradient is 0).

    Returns:
        The updated parameters and moments (the moments detached).
    """
    if moments is None:
        moments = [(torch.zeros_like(g), torch.zeros_like(g)) for g in grads]
    updated: dict[str, Tensor] = {}
    kept: list[Moments] = []
    for (name, param), size, gradient, state in zip(
        fast.items(), step_sizes, grads, moments, strict=True
    ):
        direction, (first, second) = adam_direction(gradient.detach(), state, step)
        kept.append((first, second))
        updated[name] = param - size * direction
    return updated, kept
