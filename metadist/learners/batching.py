"""Helpers of the batched inner loop: which path a model runs, and task counting."""

from __future__ import annotations

import itertools

from torch import nn


def has_batched_forward(model: nn.Module) -> bool:
    """Whether the learners may run `model` through its own `batched_forward`.

    Only when the class that defines `batched_forward` is the one that defines `forward`
    or a subclass of it: a subclass that overrides `forward` alone (and so computes
    something else) must not inherit its parent's batched path.
    """
    batched = _defining_class(type(model), "batched_forward")
    forward = _defining_class(type(model), "forward")
    return batched is not None and forward is not None and issubclass(batched, forward)


def has_batched_vjp(model: nn.Module) -> bool:
    """Whether the inner loop may take `model`'s gradients from its own `batched_vjp`
    (`metadist.learners.explicit_grad`) instead of `torch.autograd.grad`: by the rule of
    `has_batched_forward` (a subclass that overrides `forward` alone does not inherit it),
    and only for a model without tied tensors (whose gradient the written-out backward
    would split between the names)."""
    vjp = _defining_class(type(model), "batched_vjp")
    forward = _defining_class(type(model), "forward")
    return (
        vjp is not None
        and forward is not None
        and issubclass(vjp, forward)
        and not _has_tied_tensors(model)
    )


def _has_tied_tensors(model: nn.Module) -> bool:
    """Whether two parameter/buffer names of `model` share one tensor."""
    named = itertools.chain(
        model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False)
    )
    seen: set[int] = set()
    for _, tensor in named:
        if id(tensor) in seen:
            return True
        seen.add(id(tensor))
    return False


def _defining_class(cls: type, attribute: str) -> type | None:
    return next((c for c in cls.__mro__ if attribute in c.__dict__), None)


def _num_tasks(task_args: tuple) -> int:
    leaves = [t for arg in task_args for t in (arg.values() if isinstance(arg, dict) else [arg])]
    return int(leaves[0].shape[0])


VMAP_LIMITATION_MARKERS = ("vmap", "batching rule", "functorch", "batchedtensor")


def is_vmap_limitation(error: BaseException) -> bool:
    """Whether `error` is `torch.func.vmap` refusing an operation (an in-place update of
    batch-norm statistics, a data-dependent `.item()`, an op with no batching rule), as
    opposed to a real error (a bug, a bad shape, running out of memory)."""
    if not isinstance(error, (RuntimeError, NotImplementedError, ValueError)):
        return False
    if "out of memory" in str(error).lower():
        return False
    message = f"{type(error).__name__}: {error}".lower()
    return any(marker in message for marker in VMAP_LIMITATION_MARKERS)
