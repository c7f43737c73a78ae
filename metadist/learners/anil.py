"""ANIL (Raghu et al., 2020): MAML that adapts only the head in the inner loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from metadist.learners.heads import resolve_head
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
        # Set before MAML's __init__, which asks `adapted_names` for the per-layer step
        # sizes (a plain attribute: nn.Module allows it before its own __init__).
        self.head = resolve_head(model, self.read_options(options).head, "anil")
        super().__init__(model, **options)

    def adapted_names(self, params=None) -> list[str]:
        prefix = self.head + "."
        return [n for n in super().adapted_names(params) if n.startswith(prefix)]
