"""Meta-SGD (Li et al., 2017): MAML with a learned step size for every parameter entry."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from metadist.learners.base import InnerLoopLearner
from metadist.learners.registry import register_learner


@register_learner("metasgd")
class MetaSGD(InnerLoopLearner):
    """MAML whose inner update is `θ - α ⊙ ∇L`, with `α` (same shape as θ) meta-learned.

    The step sizes live in `inner_lrs`, a `ParameterDict` keyed by the parameter names
    with "." replaced by "__", initialised to `inner_lr`. Every inner step uses the same
    `α`, so evaluation may take any number of steps.

    Args:
        model: any `nn.Module`.
        **options: `InnerLoopLearner.Options` (it adds none).

    Raises:
        ValueError: a bad option, naming it.
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        parameters = dict(model.named_parameters())
        self.inner_lrs = nn.ParameterDict(
            {
                _key(name): nn.Parameter(torch.full_like(parameters[name], self.inner_lr))
                for name in self.adapted_names()
            }
        )

    def step_size(self, step: int, name: str) -> Tensor | float:
        return self.inner_lrs[_key(name)]


def _key(name: str) -> str:
    return name.replace(".", "__")
