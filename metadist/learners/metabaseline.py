"""Meta-Baseline (Chen et al., 2021): scaled cosine similarity to class prototypes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metadist.learners.base import Params
from metadist.learners.protonet import ProtoNet
from metadist.learners.registry import register_learner


@register_learner("metabaseline")
class MetaBaseline(ProtoNet):
    """Prototypical Networks with cosine logits: a query's logit for class c is
    `τ · cos(f(x), p_c)`, `p_c` the mean support embedding of class c (as in `protonet`)
    and `τ` a learned temperature. The paper meta-trains a classifier-pretrained backbone
    this way (`metadist.train.pretrain` pretrains one); there is no inner loop.

    Args:
        model: embedding network with output_shape `(D,)`.
        init_scale: initial value of the scale `τ` (> 0); the paper's 10.
        learn_scale: learn `τ` in the outer loop (False keeps it at `init_scale`).
        **options: `ProtoNet.Options` (`num_ways`, `loss`, `vectorize`), plus the two above.

    The scale is the parameter `scale` (0-dim, the model's dtype), in the learner's
    `state_dict`; with `learn_scale` false it does not require a gradient.

    Raises:
        ValueError: a bad option (e.g. `init_scale` <= 0), or as in `ProtoNet`.
    """

    @dataclass(frozen=True)
    class Options(ProtoNet.Options):
        init_scale: float = 10.0
        learn_scale: bool = True

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        init_scale = self.options.init_scale
        if not init_scale > 0:
            raise self._options_error("init_scale", "must be a number > 0", init_scale)
        reference = next(model.parameters(), None)
        self.scale = nn.Parameter(
            torch.tensor(
                float(init_scale),
                dtype=reference.dtype if reference is not None else None,
                device=reference.device if reference is not None else None,
            ),
            requires_grad=self.options.learn_scale,
        )

    def predict(self, params: Params, x: Tensor) -> Tensor:
        """Logits `[B, Q, N]`: `scale` × cosine similarity of each query embedding
        (`x [B, Q, ...]`) to each prototype (`params["prototypes"] [B, N, D]`)."""
        embeddings = F.normalize(self._embed(x), dim=-1)  # [B, Q, D]
        prototypes = F.normalize(params["prototypes"], dim=-1)  # [B, N, D]
        return self.scale * (embeddings @ prototypes.transpose(1, 2))
