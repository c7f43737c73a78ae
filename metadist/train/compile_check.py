"""Whether `trainer.compile` can compile a learner's meta-step, where that is known
before trying.

Compiled graphs have no double backward. A second-order gradient-based learner (MAML,
Meta-SGD, ANIL, MAML++ after its first-order steps) differentiates through its inner
loop's gradients; that needs a double backward unless the inner gradient is written out
(`metadist.learners.explicit_grad`: a model with its own `batched_vjp`, a loss with a
closed-form prediction gradient, the tasks run batched). Where it is not, compiling
would fail after tens of seconds of tracing; `MetaStep` skips it at once instead.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from metadist.learners.batching import has_batched_vjp
from metadist.learners.explicit_grad import PREDICTION_GRADS
from metadist.learners.inner_loop import FunctionalInnerLoop


def cannot_compile_reason(learner: nn.Module) -> str | None:
    """Why the meta-step of `learner` cannot be compiled, or `None` where it may be (the
    attempt itself still falls back to eager on any failure).

    Args:
        learner: the unwrapped learner (not its DDP wrapper).
    """
    if not isinstance(learner, FunctionalInnerLoop):
        return None
    options: Any = getattr(learner, "options", None)
    first_order = bool(getattr(options, "first_order", getattr(learner, "first_order", True)))
    if first_order or getattr(options, "inner_steps", 1) == 0:
        return None
    model = learner.model
    written_out = (
        getattr(learner, "vectorize", True)
        and getattr(learner, "_native_batching", False)
        and has_batched_vjp(model)
        and learner.loss in PREDICTION_GRADS
    )
    if written_out:
        return None
    return (
        f"second-order {type(learner).__name__} needs a double backward through "
        f"{type(model).__name__}'s autograd backward (it has no written-out batched_vjp "
        "for this loss), which compiled graphs lack"
    )
