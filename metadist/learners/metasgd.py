"""Meta-SGD (Li et al., 2017): MAML with a learned step size for every parameter entry."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from metadist.learners.base import InnerLoopLearner, register_learner


@register_learner("metasgd")
class MetaSGD(InnerLoopLearner):
    """MAML whose inner update is `θ - α ⊙ ∇L`, with `α` (same shape as θ) meta-learned.

    The step sizes live in `inner_lrs`, a `ParameterDict` keyed by the parameter names
    with "." replaced by "__", initialised to `inner_lr`. Every inner step uses the same
    `α`, so evaluation may take any number of steps.

    Args:
        model: any `nn.Module`.
        **options: `InnerLoopLearner` options (`inner_steps`, `inner_lr`,
            `eval_inner_steps`, `first_order`, `loss`, `vectorize`, `check_finite`,
            `unadapted_metrics`).

    Raises:
        ValueError: a bad option, naming it.
    """

    def __init__(
        self,
        model: nn.Module,
        inner_steps: int = 1,
        inner_lr: float = 0.01,
        eval_inner_steps: int | None = None,
        first_order: bool = False,
        loss: str = "mse",
        vectorize: bool = True,
        check_finite: bool = True,
        unadapted_metrics: bool = True,
    ) -> None:
        super().__init__(
            model,
            inner_steps=inner_steps,
            inner_lr=inner_lr,
            eval_inner_steps=eval_inner_steps,
            first_order=first_order,
            loss=loss,
            vectorize=vectorize,
            check_finite=check_finite,
            unadapted_metrics=unadapted_metrics,
        )
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
