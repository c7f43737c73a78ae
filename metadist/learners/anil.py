"""ANIL (Raghu et al., 2020): MAML that adapts only the head in the inner loop."""

from __future__ import annotations

from torch import nn

from metadist.learners.base import register_learner
from metadist.learners.maml import MAML


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
        **options: `MAML` options (`inner_steps`, `inner_lr`, `eval_inner_steps`,
            `first_order`, `learn_inner_lr`, `loss`, `vectorize`, `check_finite`,
            `unadapted_metrics`).

    Raises:
        ValueError: a `head` the model does not have or one without trainable parameters.
    """

    def __init__(
        self,
        model: nn.Module,
        head: str | None = None,
        inner_steps: int = 1,
        inner_lr: float = 0.01,
        eval_inner_steps: int | None = None,
        first_order: bool = False,
        learn_inner_lr: bool = False,
        loss: str = "mse",
        vectorize: bool = True,
        check_finite: bool = True,
        unadapted_metrics: bool = True,
    ) -> None:
        head = _resolve_head(model, head)
        super().__init__(
            model,
            inner_steps=inner_steps,
            inner_lr=inner_lr,
            eval_inner_steps=eval_inner_steps,
            first_order=first_order,
            learn_inner_lr=learn_inner_lr,
            loss=loss,
            vectorize=vectorize,
            check_finite=check_finite,
            unadapted_metrics=unadapted_metrics,
        )
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
