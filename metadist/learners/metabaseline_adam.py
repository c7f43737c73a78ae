"""Meta-Baseline with a cosine head fine-tuned on each support set by Adam-normalised
steps whose sizes are meta-learned."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metadist.learners.adam_update import adam_direction
from metadist.learners.head_fine_tuning import HeadFineTuning
from metadist.learners.registry import register_learner


@register_learner("metabaseline_adam")
class MetaBaselineAdam(HeadFineTuning):
    """Meta-Baseline whose class weights are fine-tuned on the support set with Adam's
    update, as Baseline++ fine-tunes its cosine classifier (Chen et al. 2019), inside
    meta-training and with the step sizes meta-learned.

    Each episode's weights `W [N, D]` start at its prototypes (the mean support embedding
    of each way) scaled to unit length, as Baseline++ imprints them (the cosine logits do
    not change; an Adam step's size is absolute, so the weights' length sets how far a
    step turns them: from raw prototypes, of length ≈ 29 in a trained ACSF1 embedding, 100
    steps at 0.01 barely turned them), and take `inner_steps` steps on the mean support cross-entropy of the
    cosine logits `τ · cos(f(x), w_c)`, each Adam's (Kingma & Ba 2015, as
    `torch.optim.Adam` computes it): with `g` the gradient, `m ← β1 m + (1 − β1) g`,
    `v ← β2 v + (1 − β2) g²`, `W ← W − α_t · m̂ / (√v̂ + ε)` (`m̂`, `v̂` bias-corrected).
    The step is normalised element by element, so it does not shrink with the gradient:
    at one shot, where the imprinted weights already fit the support and the gradient is
    tiny, plain SGD (`metabaseline_ft`) barely moves them, Adam moves each element by
    about `α_t`. The sizes `α_t = exp(ρ_t)`, one per step, are meta-learned through `ρ_t`
    (always positive; a change of `ρ` is a relative change of the size) with the
    embedding and `τ`. Only the head is adapted: the support is embedded once.

    With `first_order` (the default) each step's direction is a constant of the outer
    graph: the meta-gradient reaches the embedding through the prototypes and the
    queries, and the sizes through `−α_t · direction_t`. Without it, it flows through the
    support gradients and Adam's normalisation too (which is flat where `|m| ≈ √v`, and
    steep where the gradient is near 0).

    Args:
        model: embedding network with output_shape `(D,)`.
        inner_steps: fine-tuning steps of the head (≥ 0) when `adapt` is not given any.
        inner_lr: every step size `α_t` to start with (> 0).
        learn_inner_lr: meta-learn the step sizes (False keeps them at `inner_lr`).
        first_order: the step directions as constants of the outer graph (above).
        betas: Adam's `(β1, β2)`, each in `[0, 1)`.
        eps: Adam's `ε` (> 0).
        **options: `MetaBaseline.Options` (`num_ways`, `loss`, `vectorize`, `init_scale`,
            `learn_scale`).

    The log sizes are the parameter `log_inner_lrs [max(inner_steps, 1)]`;
    `adapt(support, steps)` with more steps than it holds repeats the last size.

    Raises:
        ValueError: a bad option (e.g. `inner_lr` <= 0), or as in `MetaBaseline`.
    """

    @dataclass(frozen=True)
    class Options(HeadFineTuning.Options):
        inner_steps: int = 100
        inner_lr: float = 0.01
        learn_inner_lr: bool = True
        first_order: bool = True
        betas: tuple[float, float] = (0.9, 0.999)
        eps: float = 1e-8

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        opts = self.options
        if not isinstance(opts.inner_steps, int) or opts.inner_steps < 0:
            raise self._options_error("inner_steps", "must be an int >= 0", opts.inner_steps)
        if not (isinstance(opts.inner_lr, (int, float)) and opts.inner_lr > 0):
            raise self._options_error("inner_lr", "must be a number > 0", opts.inner_lr)
        betas = tuple(opts.betas)
        if len(betas) != 2 or not all(0 <= float(b) < 1 for b in betas):
            raise self._options_error("betas", "must be two numbers in [0, 1)", opts.betas)
        if not (isinstance(opts.eps, (int, float)) and opts.eps > 0):
            raise self._options_error("eps", "must be a number > 0", opts.eps)
        self.log_inner_lrs = nn.Parameter(
            torch.full(
                (max(opts.inner_steps, 1),),
                math.log(float(opts.inner_lr)),
                dtype=self.scale.dtype,
                device=self.scale.device,
            ),
            requires_grad=opts.learn_inner_lr,
        )

    def step_sizes(self, steps: int) -> Tensor:
        """`α_t` of the first `steps` steps `[steps]` (the last size repeated past the end)."""
        index = torch.arange(steps, device=self.log_inner_lrs.device)
        return self.log_inner_lrs[index.clamp(max=self.log_inner_lrs.shape[0] - 1)].exp()

    def _fine_tune(self, embeddings: Tensor, labels: Tensor, weights: Tensor, steps: int) -> Tensor:
        """`weights [B, N, D]` after `steps` Adam steps on each task's support loss."""
        outer = torch.is_grad_enabled()  # meta-training: the outer gradient flows through
        features, one_hot, second_order = self._support_inputs(embeddings, labels, weights.shape[1])
        weights = F.normalize(weights, dim=-1)  # unit length, as Baseline++ imprints
        sizes = self.step_sizes(steps)
        moments = (torch.zeros_like(weights), torch.zeros_like(weights))
        with torch.enable_grad():
            for step in range(steps):
                point = weights if second_order else weights.detach().requires_grad_(True)
                gradient = self._support_gradient(features, one_hot, point, second_order)
                direction, moments = self.adam_direction(gradient, moments, step)
                weights = weights - sizes[step] * direction
        return weights if outer else weights.detach()

    def adam_direction(
        self, gradient: Tensor, moments: tuple[Tensor, Tensor], step: int
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Adam's step direction (to be scaled by the step size) at `step` (from 0) and
        the updated `(first, second)` moments, with `torch.optim.Adam`'s arithmetic
        (`learners.adam_update.adam_direction`, at this learner's `betas` and `eps`)."""
        return adam_direction(gradient, moments, step, self.options.betas, self.options.eps)
