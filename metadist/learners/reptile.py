"""Reptile (Nichol et al., 2018): move the initialisation towards the adapted weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from metadist.batch import MetaBatch
from metadist.learners.base import InnerLoopLearner, MetaOutput
from metadist.learners.registry import register_learner


@register_learner("reptile")
class Reptile(InnerLoopLearner):
    """First-order meta-learning by interpolation, written as one backward.

    Reptile's update is `θ ← θ + ε (φ̄ - θ)`, where `φ̄` is the mean over the batch's tasks
    of the weights after `inner_steps` SGD steps on each task's support set. It is not
    the gradient of a query loss, so `forward` returns the surrogate

        loss = mean_b 0.5 · ‖θ - stopgrad(φ_b)‖²,   whose gradient is   θ - φ̄.

    A plain `torch.optim.SGD(lr=ε)` step on it is exactly Reptile's update; other
    optimizers (e.g. Adam) treat `θ - φ̄` as the gradient, as the Reptile paper's Adam
    variant does. Because this is one backward of an ordinary loss, DDP averages
    `θ - φ̄_rank` over ranks, which (with equal tasks per rank) is `θ - φ̄` over the global
    batch — Reptile under DDP with no extra code. The inner loop never builds a graph to
    θ (always first order).

    Args:
        model: any `nn.Module`.
        inner_steps: SGD steps per task (≥ 1).
        inner_lr: inner SGD step size.
        eval_inner_steps, loss, vectorize, check_finite, unadapted_metrics: as in
            `InnerLoopLearner`.

    Metrics: `reptile_distance` (mean ‖θ - φ_b‖), `query_loss_after`,
    `support_loss_before` and, with `unadapted_metrics`, `query_loss_before`.

    Raises:
        ValueError: a bad option, naming it (e.g. `inner_steps` 0).
    """

    @dataclass(frozen=True)
    class Options(InnerLoopLearner.Options):
        """`InnerLoopLearner.Options` with 5 inner steps by default; `first_order` can
        only be true (Reptile never differentiates through its inner loop)."""

        inner_steps: int = 5
        first_order: bool = True

    def __init__(self, model: nn.Module, **options: Any) -> None:
        if options.get("first_order", True) is not True:
            raise ValueError(
                "learner.options.first_order: Reptile is first order by construction; "
                "leave it out (or true)"
            )
        super().__init__(model, **options)
        if self.inner_steps < 1:
            raise self._options_error("inner_steps", "must be >= 1 for Reptile", self.inner_steps)

    def forward(self, batch: MetaBatch) -> MetaOutput:
        """The Reptile surrogate loss over the batch's tasks (see the class docstring)."""
        params, buffers = self._state()
        self._check_usage(params, buffers, batch.support)
        names = self.adapted_names(params)
        with torch.no_grad():
            out = self._dispatch(
                lambda batched, sx, sy, qx, qy: self._score(
                    params,
                    buffers,
                    names,
                    self.inner_steps,
                    batched,
                    sx,
                    sy,
                    qx,
                    qy,
                    keep_fast=True,
                ),
                batch.support.x,
                batch.support.y,
                batch.query.x,
                batch.query.y,
            )
        self._raise_if_not_finite(out["support"], out["after"])
        fast = out.pop("fast")
        squared = sum(
            ((params[n].unsqueeze(0) - fast[n].detach()) ** 2).flatten(1).sum(1) for n in names
        )
        metrics = self._metrics(out)
        metrics["reptile_distance"] = squared.detach().sqrt().mean()
        return MetaOutput(0.5 * squared.mean(), metrics)
