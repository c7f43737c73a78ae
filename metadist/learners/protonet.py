"""Prototypical Networks (Snell et al., 2017) for N-way K-shot classification."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metadist.batch import MetaBatch, TaskSet, check_support
from metadist.learners.base import Learner, MetaOutput, Params
from metadist.learners.registry import register_learner


@register_learner("protonet")
class ProtoNet(Learner):
    """Classifies by the squared Euclidean distance to class prototypes (mean embeddings
    of each class's support examples). The model is the embedding network,
    `[..., *input_shape]` → `[..., D]`; there is no inner loop.

    Args:
        model: embedding network with output_shape `(D,)`.
        num_ways: classes per task; default: `support.y.max() + 1` of each batch.
        loss: must be "cross_entropy" (the only loss prototypes define).
        vectorize: embed all tasks in one forward (default) rather than one task at a
            time. The two agree unless the model mixes examples (batch norm in train
            mode normalises over the whole batch instead of one task).

    Raises:
        ValueError: a bad option, or (in `adapt`) a task with a class that has no
            support example.
    """

    has_inner_loop = False

    @dataclass(frozen=True)
    class Options(Learner.Options):
        loss: str = "cross_entropy"
        num_ways: int | None = None

    def __init__(self, model: nn.Module, **options: Any) -> None:
        loss = self.read_options(options).loss
        if loss != "cross_entropy":
            raise ValueError(f"learner {self.name!r}: loss must be 'cross_entropy', got {loss!r}")
        super().__init__(model, **options)
        num_ways = self.options.num_ways
        if num_ways is not None and num_ways < 2:
            raise self._options_error("num_ways", "must be an int >= 2", num_ways)
        self.num_ways = None if num_ways is None else int(num_ways)

    def forward(self, batch: MetaBatch) -> MetaOutput:
        """Cross-entropy of the query examples against the support prototypes.

        Returns:
            `MetaOutput` with loss = mean query cross-entropy over tasks; metrics
            `query_loss_after` and `query_accuracy_after`.
        """
        logits = self.predict(self.adapt(batch.support), batch.query.x)  # [B, Q, N]
        num_ways = logits.shape[-1]
        per_task = F.cross_entropy(
            logits.reshape(-1, num_ways), batch.query.y.reshape(-1), reduction="none"
        ).reshape(batch.query.y.shape)
        loss = per_task.mean()
        accuracy = (logits.argmax(-1) == batch.query.y).float().mean()
        return MetaOutput(
            loss, {"query_loss_after": loss.detach(), "query_accuracy_after": accuracy.detach()}
        )

    def adapt(self, support: TaskSet, steps: int | None = None) -> Params:
        """Class prototypes of each task.

        Args:
            support: `x [B, N*K, ...]`, `y [B, N*K]` int64 in `[0, N)`.
            steps: ignored (prototypes need no gradient steps).

        Returns:
            `{"prototypes": [B, N, D]}`.

        Raises:
            ValueError: labels outside `[0, num_ways)` or a class without support examples.
        """
        check_support(support)
        return {"prototypes": self.prototypes_of(self._embed(support.x), support.y)}

    def prototypes_of(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """Class prototypes `[B, N, D]`: the mean of each class's embeddings
        (`embeddings [B, S, D]`, `labels [B, S]`).

        Raises:
            ValueError: as `adapt`.
        """
        if labels.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"learner {self.name!r}: support.y must hold class indices, got {labels.dtype}"
            )
        num_ways = self.num_ways if self.num_ways is not None else int(labels.max()) + 1
        if int(labels.min()) < 0 or int(labels.max()) >= num_ways:
            raise ValueError(
                f"learner {self.name!r}: support labels must lie in [0, {num_ways}), got "
                f"[{int(labels.min())}, {int(labels.max())}]"
            )
        one_hot = F.one_hot(labels.long(), num_ways).to(embeddings.dtype)  # [B, NK, N]
        counts = one_hot.sum(1)  # [B, N]
        if bool((counts == 0).any()):
            task_index, label = (counts == 0).nonzero()[0].tolist()
            raise ValueError(
                f"learner {self.name!r}: class {label} has no support example in task {task_index}"
            )
        return one_hot.transpose(1, 2) @ embeddings / counts.unsqueeze(-1)

    def predict(self, params: Params, x: Tensor) -> Tensor:
        """Logits `[B, Q, N]` (negative squared distances) for `x [B, Q, ...]`."""
        embeddings = self._embed(x)  # [B, Q, D]
        prototypes = params["prototypes"]  # [B, N, D]
        return -((embeddings.unsqueeze(2) - prototypes.unsqueeze(1)).pow(2).sum(-1))  # [B, Q, N]

    def _embed(self, x: Tensor) -> Tensor:
        if self.vectorize:
            embeddings = self.model(x)
        else:
            embeddings = torch.stack([self.model(x[i]) for i in range(x.shape[0])])
        if embeddings.dim() != 3 or embeddings.shape[:2] != x.shape[:2]:
            raise ValueError(
                f"learner {self.name!r}: the model must map [B, K, ...] to [B, K, D], got "
                f"{tuple(embeddings.shape)}"
            )
        return embeddings
