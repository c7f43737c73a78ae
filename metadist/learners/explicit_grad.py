"""The inner-loop gradient written out, for models with a `batched_vjp` and the losses
below: no `torch.autograd.grad` in the inner loop.

The batched inner loop needs, per step, the gradient of the sum of the B task losses
w.r.t. every task's adapted parameters, and (for second-order MAML) that gradient must be
differentiable. A model that can give its backward as plain tensor ops
(`MLP.batched_vjp`, `metadist.models.mlp_vjp`; the forecaster's through its window map,
`metadist.models.window_vjp`) and a loss whose gradient w.r.t. the
prediction is a closed form (`PREDICTION_GRADS`) make that gradient an ordinary function
of the parameters: the outer backward then runs once through forward ops instead of
through the double backward of an autograd backward graph. Same mathematics, exact second
order; first order and no-grad evaluation compute it without any graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metadist.learners.losses import DENOMINATOR_FLOOR, task_losses

Params = dict[str, Tensor]


def _mse_grad(prediction: Tensor, target: Tensor) -> Tensor:
    return (prediction - target) * (2.0 / prediction[0].numel())


def _mae_grad(prediction: Tensor, target: Tensor) -> Tensor:
    # autograd's abs backward is sgn(error): 0 where the error is 0
    return torch.sign(prediction - target) * (1.0 / prediction[0].numel())


def _smape_grad(prediction: Tensor, target: Tensor) -> Tensor:
    # d/dp of 2|e| / max(|p| + |y|, 1e-12) where |p| + |y| > 0 (`losses._elementwise_loss`):
    # 2 (sgn(e) - |e| / d · sgn(p)) / d, the second term only where d is not the floor
    # (autograd's clamp_min backward); 0 where both are 0
    error = prediction - target
    total = prediction.abs() + target.abs()
    denominator = total.clamp_min(DENOMINATOR_FLOOR)
    relative = torch.where(total >= DENOMINATOR_FLOOR, error.abs() / denominator, 0.0)
    slope = (torch.sign(error) - relative * torch.sign(prediction)) / denominator
    return torch.where(total > 0, slope * (2.0 / prediction[0].numel()), 0.0)


def _mape_grad(prediction: Tensor, target: Tensor) -> Tensor:
    # d/dp of |e| / max(|y|, 1e-12) where y != 0: sgn(e) / |y|; 0 where y is 0
    size = target.abs()
    slope = torch.sign(prediction - target) / size.clamp_min(DENOMINATOR_FLOOR)
    return torch.where(size > 0, slope * (1.0 / prediction[0].numel()), 0.0)


def _cross_entropy_grad(prediction: Tensor, target: Tensor) -> Tensor:
    probabilities = torch.softmax(prediction, dim=-1)
    one_hot = F.one_hot(target, prediction.shape[-1]).to(prediction.dtype)
    return (probabilities - one_hot) * (1.0 / target[0].numel())


# loss name → (prediction [B, ...], target [B, ...]) ↦ d task_losses(...).sum() / d prediction
PREDICTION_GRADS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "mse": _mse_grad,
    "mae": _mae_grad,
    "smape": _smape_grad,
    "mape": _mape_grad,
    "cross_entropy": _cross_entropy_grad,
}


def explicit_inner_grads(
    model: nn.Module,
    loss: str,
    params: Params,
    names: list[str],
    x: Tensor,
    y: Tensor,
    create_graph: bool,
) -> tuple[Tensor, tuple[Tensor, ...]] | None:
    """One inner step's task losses and gradients, without `torch.autograd.grad`.

    Args:
        model: a model with `batched_vjp` (see `learners.batching.has_batched_vjp`).
        loss: the learner's loss; one of `PREDICTION_GRADS` (else None is returned).
        params: every model parameter, `[B, *shape]` per task or `[*shape]` shared.
        names: the adapted parameters, whose gradients are returned in this order.
        x: `[B, N, ...]` support inputs; y: `[B, N, ...]` support targets.
        create_graph: build the graph through the gradients (second order); False
            computes them without any graph (first order, evaluation).

    Returns:
        None where the model or the loss has no written-out gradient (the caller then
        takes the autograd path), else the support losses `[B]` (detached) and the
        gradients `[B, *shape]` of their sum w.r.t. `names`.

    Raises:
        ValueError: predictions whose shape does not fit the targets (as `task_losses`).
    """
    prediction_grad = PREDICTION_GRADS.get(loss)
    if prediction_grad is None:
        return None
    batched_vjp: Any = model.batched_vjp  # checked: has_batched_vjp
    with torch.set_grad_enabled(create_graph):
        result = batched_vjp(params, x)
        if result is None:
            return None
        prediction, vjp = result
        with torch.no_grad():  # the values, and the shape check, before the gradient
            losses = task_losses(loss, prediction, y)
        grads = vjp(prediction_grad(prediction, y), names)
    return losses, tuple(grads[n] for n in names)
