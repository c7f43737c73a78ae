"""The losses learners train and score with: per element, per task, and accuracy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

LOSSES = ("mse", "mae", "smape", "mape", "cross_entropy")
# Element-wise regression losses (prediction and target of equal shape). "smape" is the
# M3/M4 symmetric absolute percentage error as a fraction (2|y - p| / (|y| + |p|), 0 where
# both are 0): scale-free, so series of any magnitude weigh alike; meant for raw
# (unscaled) positive values, as forecasting competitions score them. "mape" is the absolute
# percentage error as a fraction (|y - p| / |y|, 0 where y is 0): scale-free too, and
# it penalises over-forecasts more than under-forecasts.
REGRESSION_LOSSES = ("mse", "mae", "smape", "mape")
# The percentage losses' denominator floor (their written-out gradients, in
# `learners.explicit_grad`, take the same).
DENOMINATOR_FLOOR = 1e-12


def _elementwise_loss(kind: str, prediction: Tensor, target: Tensor) -> Tensor:
    """Per-element regression loss of `kind` ("mse", "mae", "smape" or "mape")."""
    error = prediction - target
    if kind == "mse":
        return error.square()
    if kind == "mae":
        return error.abs()
    if kind == "mape":
        size = target.abs()
        return torch.where(size > 0, error.abs() / size.clamp_min(DENOMINATOR_FLOOR), 0.0)
    total = prediction.abs() + target.abs()
    # 0/0 (both zero) scores 0, and the denominator never reaches 0 in the backward pass.
    return torch.where(total > 0, 2 * error.abs() / total.clamp_min(DENOMINATOR_FLOOR), 0.0)


def task_loss(kind: str, prediction: Tensor, target: Tensor) -> Tensor:
    """Scalar loss of one task (or of any batch, averaged over all elements).

    Args:
        kind: "mse", "mae", "smape" (prediction and target of equal shape; see
            `REGRESSION_LOSSES`) or "cross_entropy" (prediction `[..., N]` logits, target
            `[...]` int64 class indices).
        prediction: the model's outputs.
        target: the targets.

    Raises:
        ValueError: shapes that do not fit the loss.
    """
    if kind in REGRESSION_LOSSES:
        if prediction.shape != target.shape:
            raise ValueError(
                f"{kind} loss: model output {tuple(prediction.shape)} does not match targets "
                f"{tuple(target.shape)}; check the model's output_shape"
            )
        if kind == "mse":
            return F.mse_loss(prediction, target)
        return _elementwise_loss(kind, prediction, target).mean()
    if prediction.shape[:-1] != target.shape:
        raise ValueError(
            f"cross_entropy loss: model output {tuple(prediction.shape)} must be targets "
            f"{tuple(target.shape)} plus a class dimension"
        )
    return F.cross_entropy(prediction.reshape(-1, prediction.shape[-1]), target.reshape(-1))


def task_losses(kind: str, prediction: Tensor, target: Tensor) -> Tensor:
    """Per-task losses `[B]` of a batch of tasks: `task_loss` of each task's slice.

    Args:
        kind: one of `LOSSES` (see `task_loss`).
        prediction: `[B, ...]` model outputs.
        target: `[B, ...]` targets.

    Raises:
        ValueError: shapes that do not fit the loss (named per task, without B).
    """
    num_tasks = prediction.shape[0]
    if kind in REGRESSION_LOSSES:
        if prediction.shape != target.shape:
            raise ValueError(
                f"{kind} loss: model output {tuple(prediction.shape[1:])} does not match "
                f"targets {tuple(target.shape[1:])}; check the model's output_shape"
            )
        return _elementwise_loss(kind, prediction, target).reshape(num_tasks, -1).mean(1)
    if prediction.shape[:-1] != target.shape:
        raise ValueError(
            f"cross_entropy loss: model output {tuple(prediction.shape[1:])} must be targets "
            f"{tuple(target.shape[1:])} plus a class dimension"
        )
    losses = F.cross_entropy(
        prediction.reshape(-1, prediction.shape[-1]), target.reshape(-1), reduction="none"
    )
    return losses.reshape(num_tasks, -1).mean(1)


def _accuracy(prediction: Tensor, target: Tensor, batched: bool = False) -> Tensor:
    """Fraction of correct argmax predictions: per task `[B]` when batched, else scalar."""
    correct = (prediction.argmax(dim=-1) == target).to(prediction.dtype)
    return correct.reshape(correct.shape[0], -1).mean(1) if batched else correct.mean()
