"""MAML (Finn et al., 2017): learn an initialisation that adapts in a few gradient steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from metadist.learners.base import InnerLoopLearner
from metadist.learners.registry import register_learner


@register_learner("maml")
class MAML(InnerLoopLearner):
    """Model-agnostic meta-learning, second order by default.

    The meta-loss is the mean over tasks of the query loss after `inner_steps` gradient
    steps on the support set; its gradient flows back through the inner updates (set
    `first_order=True` for FOMAML).

    Args:
        model: any `nn.Module`.
        learn_inner_lr: learn one inner step size per inner step (initialised to
            `inner_lr`, parameter `inner_lrs [inner_steps]`, as in MAML++). Evaluation
            with more steps than `inner_steps` reuses the last learned step size.
        **options: `InnerLoopLearner.Options`, plus `learn_inner_lr`.

    Raises:
        ValueError: a bad option (e.g. `learn_inner_lr` with 0 inner steps).
    """

    @dataclass(frozen=True)
    class Options(InnerLoopLearner.Options):
        learn_inner_lr: bool = False

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        self.learn_inner_lr = self.options.learn_inner_lr
        if self.learn_inner_lr:
            if self.inner_steps == 0:
                raise self._options_error(
                    "inner_steps", "must be >= 1 when learn_inner_lr is true", self.inner_steps
                )
            reference = next(model.parameters())
            self.inner_lrs = nn.Parameter(
                torch.full(
                    (self.inner_steps,),
                    self.inner_lr,
                    dtype=reference.dtype,
                    device=reference.device,
                )
            )

    def step_size(self, step: int, name: str) -> Tensor | float:
        if self.learn_inner_lr:
            return self.inner_lrs[min(step, self.inner_steps - 1)]
        return self.inner_lr
