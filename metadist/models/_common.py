"""Option checks and shape handling shared by the built-in models."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "silu": nn.SiLU}


def positive_int(model: str, field: str, value: int) -> int:
    """`int(value)`, or `ValueError` naming the model option if it is below 1."""
    if int(value) < 1:
        raise ValueError(f"model {model!r}: {field} must be >= 1, got {value!r}")
    return int(value)


def hidden_sizes(model: str, value: Sequence[int]) -> tuple[int, ...]:
    """Validated tuple of hidden layer widths (may be empty)."""
    return tuple(positive_int(model, "hidden_sizes", v) for v in value)


def dropout_rate(model: str, value: float) -> float:
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"model {model!r}: dropout must be in [0, 1), got {value!r}")
    return float(value)


def activation(model: str, name: str) -> type[nn.Module]:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        known = ", ".join(sorted(_ACTIVATIONS))
        raise ValueError(
            f"model {model!r}: activation must be one of {known}, got {name!r}"
        ) from None


def window_shape(model: str, input_shape: tuple[int, ...]) -> tuple[int, int]:
    """`(L, F)` from `input_shape`, or `ValueError` if the model needs windows and got none."""
    if len(input_shape) != 2:
        raise ValueError(
            f"model {model!r} reads windows: input_shape must be (L, F), got {input_shape!r}"
        )
    return input_shape[0], input_shape[1]


def split_leading(model: str, x: Tensor, example_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The leading dims of `x [..., *example_shape]`; `ValueError` if the trailing dims differ."""
    num_example_dims = len(example_shape)
    if x.dim() < num_example_dims or tuple(x.shape[x.dim() - num_example_dims :]) != example_shape:
        raise ValueError(
            f"model {model!r} expects inputs [..., {', '.join(map(str, example_shape))}], "
            f"got {tuple(x.shape)}"
        )
    return tuple(x.shape[: x.dim() - num_example_dims])


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
