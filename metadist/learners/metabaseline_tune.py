"""`metabaseline_adam` whose evaluation fine-tunes the whole embedding network on each
support set too, as P>M>F fine-tunes its meta-trained backbone at test time."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

from metadist.batch import TaskSet, check_support
from metadist.learners.base import Params
from metadist.learners.batching import is_vmap_limitation
from metadist.learners.metabaseline_adam import MetaBaselineAdam
from metadist.learners.registry import register_learner

logger = logging.getLogger("metadist.learners")

# The key prefix of the embedding's per-task parameters in what `adapt` returns.
PREFIX = "embedding."


@register_learner("metabaseline_tune")
class MetaBaselineTune(MetaBaselineAdam):
    """Meta-Baseline with an Adam-tuned head (`metabaseline_adam`), and at evaluation the
    embedding network fine-tuned on each support set with it (Hu et al. 2022, "Pushing
    the limits of simple pipelines for few-shot learning": pre-train, meta-train, then
    fine-tune the backbone at test time).

    Meta-training is `metabaseline_adam`'s, exactly (adaptation with gradient enabled
    tunes the head only: fine-tuning the network inside every meta-step would cost
    `inner_steps` backward passes of it per task). Adaptation without gradient (the
    evaluation, meta-val included) gives each task its own copy of the embedding's
    parameters and of the unit-length prototypes and trains both together, for
    `inner_steps` Adam steps on the support cross-entropy of `τ · cos(f_θ(x), w_c)`: the
    head at the meta-learned sizes `α_t`, the network at `embedding_lr`. Queries are then
    embedded by their task's network. The tasks of a batch train at once (`vmap` of
    `functional_call` over the per-task parameters); each task's loss is its own.

    Args:
        model: embedding network with output_shape `(D,)` (no batch-norm statistics are
            updated: its buffers are used as they are).
        embedding_lr: the network's Adam step size at evaluation (> 0).
        **options: `MetaBaselineAdam.Options`.

    Raises:
        ValueError: a bad option (e.g. `embedding_lr` <= 0), or as in `MetaBaselineAdam`.
    """

    @dataclass(frozen=True)
    class Options(MetaBaselineAdam.Options):
        embedding_lr: float = 0.001

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        self._tune_loops = False  # set once vmap has refused the model (`_embed_with`)
        lr = self.options.embedding_lr
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise self._options_error("embedding_lr", "must be a number > 0", lr)

    def adapt(self, support: TaskSet, steps: int | None = None) -> Params:
        """Per-task class weights, and at evaluation per-task embedding parameters.

        Args:
            support: `x [B, N*K, ...]`, `y [B, N*K]` int64 in `[0, N)`.
            steps: fine-tuning steps (None: `inner_steps`; 0: the prototypes).

        Returns:
            `{"prototypes": [B, N, D]}`, with gradient enabled or `steps=0`; otherwise
            also `{"embedding.<name>": [B, *shape]}` for every parameter of the model.

        Raises:
            ValueError: steps < 0, or as in `ProtoNet.adapt`.
        """
        check_support(support)
        steps = self.options.inner_steps if steps is None else int(steps)
        if steps <= 0 or torch.is_grad_enabled():
            return super().adapt(support, steps)
        return self._tune_all(support, steps)

    def predict(self, params: Params, x: Tensor) -> Tensor:
        """Logits `[B, Q, N]`: `τ` × cosine of each query's embedding (by its task's
        network where `params` has one) to each class weight."""
        embedding = {k[len(PREFIX) :]: v for k, v in params.items() if k.startswith(PREFIX)}
        if not embedding:
            return super().predict(params, x)
        queries = F.normalize(self._embed_with(embedding, x), dim=-1)  # [B, Q, D]
        weights = F.normalize(params["prototypes"], dim=-1)  # [B, N, D]
        return self.scale * (queries @ weights.transpose(1, 2))

    def _embed_with(self, embedding: Params, x: Tensor) -> Tensor:
        """`[B, M, D]`: each task's `x [B, M, ...]` through its own parameters `[B, ...]`.

        The tasks run together under `vmap` (`vectorize`, the default); a model `vmap`
        cannot batch (a GRU) runs them one at a time from then on, said once in the log.
        """
        buffers = dict(self.model.named_buffers())

        def one_task(task_params: Params, task_x: Tensor) -> Tensor:
            return functional_call(self.model, (task_params, buffers), (task_x,))

        def loop() -> Tensor:
            tasks = range(x.shape[0])
            return torch.stack(
                [one_task({k: v[i] for k, v in embedding.items()}, x[i]) for i in tasks]
            )

        if not self.vectorize or self._tune_loops:
            return loop()
        try:
            return vmap(one_task, randomness="different")(embedding, x)
        except Exception as error:
            if not is_vmap_limitation(error):
                raise
            result = loop()  # only a loop that succeeds makes it the model's vmap support
            self._tune_loops = True
            logger.warning(
                "learner %r: vmap cannot batch model %s at test-time tuning (%s); tuning "
                "tasks one at a time",
                self.name,
                type(self.model).__name__,
                str(error).strip().splitlines()[0][:200]
                if str(error).strip()
                else type(error).__name__,
            )
            return result

    def _tune_all(self, support: TaskSet, steps: int) -> Params:
        """The embedding and the head of each task after `steps` Adam steps together."""
        batch = support.x.shape[0]
        embedding = {
            name: p.detach().expand(batch, *p.shape).clone()
            for name, p in self.model.named_parameters()
        }
        weights = self.prototypes_of(self._embed_with(embedding, support.x), support.y)
        weights = F.normalize(weights, dim=-1)  # unit length, as Baseline++ imprints
        one_hot = F.one_hot(support.y.long(), weights.shape[1]).to(weights.dtype)
        sizes = self.step_sizes(steps).detach()
        leaves = [weights, *embedding.values()]
        moments = [(torch.zeros_like(t), torch.zeros_like(t)) for t in leaves]
        scale = self.scale.detach()
        for step in range(steps):
            with torch.enable_grad():
                points = [t.detach().requires_grad_(True) for t in leaves]
                named = dict(zip(embedding, points[1:], strict=True))
                features = F.normalize(self._embed_with(named, support.x), dim=-1)
                directions = F.normalize(points[0], dim=-1).transpose(1, 2)
                logits = scale * (features @ directions)  # [B, S, N]
                loss = -(one_hot * logits.log_softmax(-1)).sum() / features.shape[1]
                gradients = torch.autograd.grad(loss, points)
            rates = [sizes[step]] + [self.options.embedding_lr] * len(embedding)
            for i, (gradient, rate) in enumerate(zip(gradients, rates, strict=True)):
                direction, moments[i] = self.adam_direction(gradient, moments[i], step)
                leaves[i] = leaves[i] - rate * direction
        tuned = {PREFIX + name: t for name, t in zip(embedding, leaves[1:], strict=True)}
        return {"prototypes": leaves[0], **tuned}
