"""What the Meta-Baseline learners that fine-tune their cosine head per support set share:
`adapt` (prototypes, then the subclass's `_fine_tune`), the support inputs of the head's
loss and its gradient. `metabaseline_ft` steps by SGD, `metabaseline_adam` by Adam."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from metadist.batch import TaskSet, check_support
from metadist.learners.base import Params
from metadist.learners.metabaseline import MetaBaseline


class HeadFineTuning(MetaBaseline):
    """Meta-Baseline whose class weights start at each episode's prototypes and are then
    fine-tuned on its support set (`_fine_tune`, the subclass's update rule)."""

    @dataclass(frozen=True)
    class Options(MetaBaseline.Options):
        inner_steps: int = 5
        first_order: bool = False

    def adapt(self, support: TaskSet, steps: int | None = None) -> Params:
        """Fine-tuned class weights of each task.

        Args:
            support: `x [B, N*K, ...]`, `y [B, N*K]` int64 in `[0, N)`.
            steps: fine-tuning steps (None: `inner_steps`; 0: the prototypes).

        Returns:
            `{"prototypes": [B, N, D]}`, the weights `predict` compares queries with.

        Raises:
            ValueError: steps < 0, or as in `ProtoNet.adapt`.
        """
        check_support(support)
        steps = self.options.inner_steps if steps is None else int(steps)
        if steps < 0:
            raise ValueError(f"learner {self.name!r}: steps must be >= 0, got {steps}")
        embeddings = self._embed(support.x)  # [B, S, D]
        weights = self.prototypes_of(embeddings, support.y)  # [B, N, D]
        if steps == 0:
            return {"prototypes": weights}
        return {"prototypes": self._fine_tune(embeddings, support.y, weights, steps)}

    def _fine_tune(self, embeddings: Tensor, labels: Tensor, weights: Tensor, steps: int) -> Tensor:
        raise NotImplementedError  # each subclass's update rule

    def _support_inputs(
        self, embeddings: Tensor, labels: Tensor, num_ways: int
    ) -> tuple[Tensor, Tensor, bool]:
        """`(features [B, S, D], one_hot [B, S, N], second_order)` of the head's support
        loss: unit-length features, detached unless the steps are differentiated through
        (meta-training without `first_order`)."""
        second_order = torch.is_grad_enabled() and not self.options.first_order
        features = F.normalize(embeddings, dim=-1)
        one_hot = F.one_hot(labels.long(), num_ways).to(features.dtype)
        return (features if second_order else features.detach()), one_hot, second_order

    def _support_gradient(
        self, features: Tensor, one_hot: Tensor, weights: Tensor, create_graph: bool
    ) -> Tensor:
        """∇_W of each episode's mean support cross-entropy, summed over episodes (so each
        episode's gradient is its own): `[B, N, D]`."""
        scale = self.scale if create_graph else self.scale.detach()
        logits = scale * (features @ F.normalize(weights, dim=-1).transpose(1, 2))  # [B, S, N]
        loss = -(one_hot * logits.log_softmax(-1)).sum() / features.shape[1]
        (gradient,) = torch.autograd.grad(loss, weights, create_graph=create_graph)
        return gradient
