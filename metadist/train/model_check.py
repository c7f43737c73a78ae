"""A run's model checked before training: its first output, on one task of the sampler's
first batch, and that something in it is trainable. A model of one's own that returns a
tuple, an integer tensor or another shape than the one it was built for, or whose every
parameter is frozen, is refused in one line naming it and what is wrong, not by a
traceback from deep in a learner's loss or the optimizer."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from metadist.batch import MetaBatch
from metadist.user_code import user_code_location


def model_label(model: nn.Module, name: str) -> str:
    """`model 'my_gru' (MyGRU)`: the registered name and the class."""
    return f"model {name!r} ({type(model).__name__})"


def check_model_output(
    model: nn.Module, name: str, example: MetaBatch | None, output_shape: tuple[int, ...]
) -> None:
    """Calls `model` (in eval mode, without gradients: no buffer or random state changes)
    on the support inputs `[K, ...]` of the first task of `example`, the sampler's first
    batch, and checks that it returns one floating-point tensor `[K, *output_shape]`.
    Nothing is checked where there is no example (a run rebuilt from its record).

    Raises:
        ValueError: the output is not such a tensor, or the call failed in the user's
            code (with the error and its file and line); naming the model.
    """
    if example is None:
        return
    inputs = example.support.x[0]
    label = model_label(model, name)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            output = model(inputs)
    except Exception as error:  # noqa: BLE001 - the user's model, whatever it raised
        where = user_code_location(error, installed=False)
        if not where:
            raise  # metadist's own model: its traceback is the report
        raise ValueError(
            f"{label}: forward failed on one task's support inputs {list(inputs.shape)}: "
            f"{type(error).__name__}: {error}{where}"
        ) from None
    finally:
        model.train(was_training)
    wanted = [inputs.shape[0], *output_shape]
    if not isinstance(output, Tensor):
        raise ValueError(
            f"{label}: forward returned a value of type {type(output).__name__}, not a tensor; it must "
            f"return one tensor {wanted} for inputs {list(inputs.shape)}"
        )
    if not output.is_floating_point():
        raise ValueError(
            f"{label}: forward returned a tensor of {output.dtype}; the learners need a "
            "floating-point output (their gradients flow through it)"
        )
    if list(output.shape) != wanted:
        raise ValueError(
            f"{label}: forward of inputs {list(inputs.shape)} returned "
            f"{list(output.shape)}; it must return {wanted}: the examples, then the "
            f"output_shape {tuple(output_shape)} it was built with"
        )


def check_trainable(learner: nn.Module, model: nn.Module, name: str) -> None:
    """Raises a one-line `ValueError` naming the model where no parameter of `learner`
    (its model's and its own) requires a gradient: there would be nothing to meta-train."""
    if not any(p.requires_grad for p in learner.parameters()):
        count = sum(1 for _ in model.parameters())
        held = (
            f"all {count} of its parameter tensors have requires_grad=False"
            if count
            else "it has no parameters (a layer kept in a plain list or dict is not one)"
        )
        raise ValueError(
            f"{model_label(model, name)}: nothing to meta-train: {held}; leave the ones "
            "to learn with requires_grad=True"
        )
