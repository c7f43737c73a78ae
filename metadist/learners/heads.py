"""A model's head, and the shared head that makes a classifier's ways interchangeable.

`resolve_head` finds the sub-module a learner treats as the head (ANIL adapts only it).

`SharedRowLinear` is Unicorn-MAML's head (Ye & Chao, 2022): the N rows of a classifier's
last linear layer start every task from ONE learned vector `w [D]` (and one learned bias
`b`), so no way is special before adaptation. The inner loop adapts the N rows apart (the
learner expands `w` to `[N, D]` first, `expand_shared_rows`), so MAML's adapted
predictions depend on the way labels only through their order: permuting the labels of
a task's support and query sets permutes the logits' columns, and the predicted classes
follow the labels (plain MAML learns a different initial row per way, so which class
gets label 0 in an episode changes its prediction).

For cross-entropy, softmax removes whatever the rows share, so `w` and `b` cancel out of
the adapted predictions: their meta-gradient is zero (up to rounding) and the option's
whole effect is that every way starts alike. They are still parameters, for losses that
do see them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Params = dict[str, Tensor]


def resolve_head(model: nn.Module, head: str | None, learner: str = "anil") -> str:
    """The name of `model`'s head sub-module.

    Args:
        model: the learner's model.
        head: a sub-module name (as in `model.get_submodule`), or None: the sub-module
            `head` if the model has one (every built-in model does), else its last child
            module holding trainable parameters.
        learner: the learner's name, for messages.

    Raises:
        ValueError: a `head` the model does not have, or one without trainable parameters.
    """
    if head is None:
        if hasattr(model, "head") and isinstance(model.head, nn.Module):
            head = "head"
        else:
            trainable = [
                name
                for name, child in model.named_children()
                if any(p.requires_grad for p in child.parameters())
            ]
            if not trainable:
                raise ValueError(
                    f"learner {learner!r}: the model has no child module with parameters"
                )
            head = trainable[-1]
    if not isinstance(head, str):
        raise ValueError(f"learner {learner!r}: head must be a sub-module name, got {head!r}")
    try:
        module = model.get_submodule(head)
    except AttributeError:
        children = ", ".join(name for name, _ in model.named_children())
        raise ValueError(
            f"learner {learner!r}: head {head!r} is not a sub-module of the model; "
            f"children: {children}"
        ) from None
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(f"learner {learner!r}: head {head!r} has no trainable parameters")
    return head


class SharedRowLinear(nn.Module):
    """A linear layer `D → N` whose N rows are one vector: parameters `weight [D]` and
    `bias []` (or no bias); `y = x @ expand(weight).T + bias` gives N equal outputs.

    Called with a full `[N, D]` weight and `[N]` bias in their place (what
    `torch.func.functional_call` passes once an inner loop has adapted the rows apart),
    it is an ordinary linear layer with them.

    With `normalise_input` (set by Proto-MAML, `learners.proto_head`) the input is
    L2-normalised first, `y = (x / |x|) @ weight.T + bias`: the logits' scale, and with it
    the inner loop's step sizes, no longer depend on the features' length.

    Args:
        linear: the layer it replaces; the shared row and bias start as the mean of its
            rows and biases (no random draw).
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.normalise_input = False
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            self.weight = nn.Parameter(linear.weight.mean(0).clone())
            self.bias = (
                nn.Parameter(linear.bias.mean().clone()) if linear.bias is not None else None
            )

    def forward(self, x: Tensor) -> Tensor:
        weight: Tensor = self.weight
        bias: Tensor | None = self.bias
        if weight.dim() == 1:
            weight = weight.expand(self.out_features, -1)
        if bias is not None and bias.dim() == 0:
            bias = bias.expand(self.out_features)
        if self.normalise_input:
            x = F.normalize(x, dim=-1)
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features} "
            f"(one shared row), bias={self.bias is not None}"
            + (", input L2-normalised" if self.normalise_input else "")
        )


def share_head_rows(model: nn.Module, learner: str) -> tuple[str, int]:
    """Replaces `model`'s head (`resolve_head`'s default) by a `SharedRowLinear` in
    place; a head that already is one stays. Returns `(head name, N)`.

    Raises:
        ValueError: the head is neither an `nn.Linear` nor a `SharedRowLinear`.
    """
    name = resolve_head(model, None, learner)
    head = model.get_submodule(name)
    if isinstance(head, nn.Linear):
        parent, _, attribute = name.rpartition(".")
        head = SharedRowLinear(head)
        setattr(model.get_submodule(parent), attribute, head)
    elif not isinstance(head, SharedRowLinear):
        raise ValueError(
            f"learner {learner!r}: shared_head needs the model's head {name!r} to be an "
            f"nn.Linear (one row per way), got {type(head).__name__}"
        )
    return name, head.out_features


def expand_shared_rows(params: Mapping[str, Tensor], head: str, num_ways: int) -> Params:
    """`params` (by name) with the shared head's `weight [D]` and `bias []` expanded to
    the N rows `[N, D]` and biases `[N]` an inner loop adapts (views: the gradients flow
    back into the shared row)."""
    out = dict(params)
    weight, bias = f"{head}.weight", f"{head}.bias"
    # Views with a gradient path even under no_grad, as the leaves they stand in for have:
    # the learner's check that every adapted parameter gets a gradient runs in any mode.
    with torch.enable_grad():
        out[weight] = params[weight].expand(num_ways, -1)
        if bias in params:
            out[bias] = params[bias].expand(num_ways)
    return out
