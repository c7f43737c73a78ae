"""The model registry: `@register_model("name")`, `build_model`, `registered_models`.

A model's options are its nested `Options` dataclass where it declares one (the built-in
models do: `models._common.ConfigurableModel`, constructed as
`cls(input_shape, output_shape, options=typed)` and keeping it as `self.options`), else
the keyword parameters of its constructor after the two shapes (constructed as
`cls(input_shape, output_shape, **options)`). They are read through
`metadist.registry.Registry`, so `model.options.hiden_sizes=[64]` is one error naming the
path and `hidden_sizes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from metadist.registry import Registry

MODELS: Registry[type[nn.Module]] = Registry("model", nn.Module, positional=2)


def register_model(name: str):
    """Class decorator registering an `nn.Module` class under `name`.

    The class is constructed as `cls(input_shape, output_shape, **options)`.

    Example:
        >>> @register_model("my_model")
        ... class MyModel(nn.Module): ...
    """
    return MODELS.register(name)


def registered_models() -> list[str]:
    """Names of all registered models, sorted."""
    return MODELS.names()


def get_model(name: str) -> type[nn.Module]:
    """The model class registered as `name`; `ValueError` naming the closest one."""
    return MODELS.get(name)


def build_model(
    name: str,
    input_shape: Sequence[int],
    output_shape: Sequence[int],
    *,
    options: Any = None,
    **keywords: Any,
) -> nn.Module:
    """Builds the model registered as `name`.

    Args:
        name: registry name, e.g. "mlp", "forecaster", "tcn", "transformer", "gru".
        input_shape: shape of one example, e.g. `(1,)` or `(L, F)`.
        output_shape: shape of one prediction, e.g. `(1,)`, `(H, T)` or `(N,)`.
        options: the model options as a mapping, or as the typed object
            `MODELS.read_options` gives; or give them as `keywords` (hidden sizes, ...).
            Unknown keys and wrong types are refused first (naming
            `model.options.<key>`), values by the model.
        **keywords: the options as keywords, instead of `options`.

    Raises:
        ValueError: unknown name, shapes the model cannot serve, or a bad option.
        TypeError: both `options` and `keywords` given.
    """
    if options is not None and keywords:
        raise TypeError(f"build_model({name!r}): options or keywords, not both")
    get_model(name)
    return MODELS.build(
        name,
        tuple(_check_shape(name, "input_shape", input_shape)),
        tuple(_check_shape(name, "output_shape", output_shape)),
        options=keywords if options is None else options,
    )


def _check_shape(model: str, field: str, shape: Sequence[int]) -> list[int]:
    try:
        dims = [int(d) for d in shape]
    except TypeError:
        raise ValueError(
            f"model {model!r}: {field} must be a sequence of ints, got {shape!r}"
        ) from None
    if not dims or any(d < 1 for d in dims):
        raise ValueError(
            f"model {model!r}: {field} must be non-empty with dims >= 1, got {shape!r}"
        )
    return dims
