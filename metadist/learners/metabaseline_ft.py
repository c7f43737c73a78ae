"""Meta-Baseline with a cosine head fine-tuned on each support set, the steps meta-learned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from metadist.learners.head_fine_tuning import HeadFineTuning
from metadist.learners.registry import register_learner


@register_learner("metabaseline_ft")
class MetaBaselineFineTune(HeadFineTuning):
    """Meta-Baseline whose class weights are fine-tuned on the support set, as Baseline++
    fine-tunes its cosine classifier (Chen et al. 2019), but inside meta-training.

    Each episode's weights start at its prototypes (the mean support embedding of each
    way, "weight imprinting"), then take `inner_steps` gradient steps on the support
    cross-entropy of the cosine logits `τ · cos(f(x), w_c)`:
    `W ← W − α_t ∇_W L_support(W)`. The step sizes `α_t` (one per step) are parameters of
    the learner, meta-learned with the embedding and `τ` through the steps (second order
    unless `first_order`), so meta-training decides how far fine-tuning moves the
    weights; with `α_t = 0`, or `steps=0`, this is `metabaseline`. Only the head is
    adapted: the embedding of the support is computed once.

    Args:
        model: embedding network with output_shape `(D,)`.
        inner_steps: fine-tuning steps of the head (≥ 0) when `adapt` is not given any.
        inner_lr: the initial value of every step size `α_t` (≥ 0).
        learn_inner_lr: meta-learn the step sizes (False keeps them at `inner_lr`).
        first_order: do not differentiate through the head's gradient (the outer
            gradient still flows through the prototypes and the step sizes).
        **options: `MetaBaseline.Options` (`num_ways`, `loss`, `vectorize`, `init_scale`,
            `learn_scale`).

    `adapt(support, steps)` with more steps than `inner_steps` repeats the last step size.

    Raises:
        ValueError: a bad option (e.g. `inner_steps` < 0), or as in `MetaBaseline`.
    """

    @dataclass(frozen=True)
    class Options(HeadFineTuning.Options):
        inner_steps: int = 5
        inner_lr: float = 0.5
        learn_inner_lr: bool = True
        first_order: bool = False

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        steps, lr = self.options.inner_steps, self.options.inner_lr
        if not isinstance(steps, int) or steps < 0:
            raise self._options_error("inner_steps", "must be an int >= 0", steps)
        if not lr >= 0:
            raise self._options_error("inner_lr", "must be a number >= 0", lr)
        self.inner_lrs = nn.Parameter(
            torch.full(
                (max(steps, 1),), float(lr), dtype=self.scale.dtype, device=self.scale.device
            ),
            requires_grad=self.options.learn_inner_lr,
        )

    def _fine_tune(self, embeddings: Tensor, labels: Tensor, weights: Tensor, steps: int) -> Tensor:
        """`weights [B, N, D]` after `steps` gradient steps on the support cross-entropy."""
        outer = torch.is_grad_enabled()  # meta-training: the outer gradient flows through
        features, one_hot, second_order = self._support_inputs(embeddings, labels, weights.shape[1])
        with torch.enable_grad():
            for step in range(steps):
                point = weights if second_order else weights.detach().requires_grad_(True)
                gradient = self._support_gradient(features, one_hot, point, second_order)
                rate = self.inner_lrs[min(step, self.inner_lrs.shape[0] - 1)]
                weights = weights - rate * gradient
        return weights if outer else weights.detach()
