"""Proto-MAML's head: every task's classifier rows start at its support prototypes.

Triantafillou et al. (2020, Meta-Dataset) start MAML's linear head, for each task, at the
nearest-centroid classifier of its support set: row c is `2·s·μ_c` and bias `-s·|μ_c|²`,
where `μ_c` is the mean feature of way c, so the logits before any inner step are
`-s·|f - μ_c|²` up to a constant (Prototypical Networks), and the inner loop refines them
and the body from there. Here the features are L2-normalised first (the shared head's
`normalise_input`), so `s` sets the logits' scale whatever the backbone's features'
length: a backbone pretrained without normalisation layers has features far longer than
a fresh one (about 69 against 6 in the 1-D conv net of the UCR recipes), which made the
plain head's SGD steps diverge at MAML's step sizes.

The rows are added to the shared head's (Unicorn-MAML, `learners.heads`), so no way is
special and permuting the labels permutes the logits. The prototypes are read off
autograd rather than out of the model: the logits are linear in the head's rows, so the
gradient of `Σ_i logit[i, y_i]` with respect to row c is the sum of way c's
(normalised) features. That works for any model whose head is the shared linear layer,
through every path the inner loop runs (per task, `vmap`, a model's own batched forward).
In training the prototypes stay differentiable, so the meta-gradient reaches the body
through them too (as in Proto-MAML).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

Params = dict[str, Tensor]


@dataclass(frozen=True)
class PrototypeHead:
    """Where the rows are, and their scale.

    Attributes:
        head: the name of the model's shared linear head (`weight [N, D]`, `bias [N]`
            once expanded).
        num_ways: N.
        scale: `s`, the logits' scale (a squared distance between unit vectors is at most 4).
    """

    head: str
    num_ways: int
    scale: float

    def initial_rows(
        self,
        logits_of: Callable[[Params], Tensor],
        fast: Params,
        labels: Tensor,
        build_graph: bool,
    ) -> Params:
        """`fast` with the head's rows and biases moved to the support prototypes.

        Args:
            logits_of: the model's logits `[..., K·N, N]` on the support inputs with the
                given adapted parameters.
            fast: the adapted parameters, `head.weight [..., N, D]` and `head.bias
                [..., N]` among them (a leading task dim B when batched).
            labels: `[..., K·N]` int64 way labels in `[0, N)`.
            build_graph: whether the rows stay differentiable functions of the
                meta-parameters (training), else detached.

        Returns:
            `fast` with `weight + 2·s·μ` and `bias - s·|μ|²` for the head, and fresh
            views of its other tensors: the rows depend on those through the
            prototypes, and the inner steps' gradients with respect to the returned
            tensors must not run back through them (the inner loop adapts the rows as
            parameters of their own, as Proto-MAML does; `torch.autograd.grad` with
            respect to a tensor the rows were computed from would add that path).
        """
        weight_name, bias_name = f"{self.head}.weight", f"{self.head}.bias"
        with torch.enable_grad():
            params = fast if build_graph else {n: v.detach() for n, v in fast.items()}
            weight = params[weight_name]
            if not build_graph:
                weight = weight.requires_grad_()
            logits = logits_of({**params, weight_name: weight})
            one_hot = F.one_hot(labels, self.num_ways).to(logits.dtype)
            (sums,) = torch.autograd.grad(
                (logits * one_hot).sum(), weight, create_graph=build_graph
            )
        counts = one_hot.sum(dim=-2).clamp(min=1.0)  # [..., N]
        means = sums / counts.unsqueeze(-1)  # [..., N, D]
        if not build_graph:
            means = means.detach()
        out = {n: v.view_as(v) for n, v in fast.items()}
        out[weight_name] = fast[weight_name] + 2 * self.scale * means
        out[bias_name] = fast[bias_name] - self.scale * means.square().sum(dim=-1)
        return out
