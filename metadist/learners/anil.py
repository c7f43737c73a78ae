"""ANIL (Raghu et al., 2020): MAML that adapts only the head in the inner loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from metadist.learners.maml import MAML
from metadist.learners.registry import register_learner


@register_learner("anil")
class ANIL(MAML):
    """Almost No Inner Loop: the inner loop updates the head's parameters only; the body
    is learned by the outer loop alone (its meta-gradient still flows through the
    adapted head).

    Args:
        model: any `nn.Module`.
        head: name of the sub-module to adapt (as in `model.get_submodule`). Default: the
            sub-module `head` if the model has one (every built-in model does), else the
            last child module that holds trainable parameters.
        **options: `MAML.Options`, plus `head`.

    Raises:
        ValueError: a `head` the model does not have or one without trainable parameters.
    """

    @dataclass(frozen=True)
    class Options(MAML.Options):
        head: str | None = None

    def __init__(self, model: nn.Module, **options: Any) -> None:
        head = _resolve_head(model, self.read_options(options).head)
        super().__init__(model, **options)
        self.head = head

    def adapted_names(self, params=None) -> list[str]:
        prefix = self.head + "."
        return [n for n in super().adapted_names(params) if n.startswith(prefix)]


def _resolve_head(model: nn.Module, head: str | None) -> str:
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
                raise ValueError("learner 'anil': the model has no child module with parameters")
            head = trainable[-1]
    if not isinstance(head, str):
        raise ValueError(f"learner 'anil': head must be a sub-module name, got {head!r}")
    try:
        module = model.get_submodule(head)
    except AttributeError:
        children = ", ".join(name for name, _ in model.named_children())
        raise ValueError(
            f"learner 'anil': head {head!r} is not a sub-module of the model; children: {children}"
        ) from None
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(f"learner 'anil': head {head!r} has no trainable parameters")
    return head
