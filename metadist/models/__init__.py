"""Models: plain `nn.Module`s that map `[..., *input_shape]` → `[..., *output_shape]`.

Every model is built from the shapes of the task family it serves, e.g. `(1,)` → `(1,)`
for sinusoid regression, `(L, F)` → `(H, T)` for forecasting windows, `(L, F)` → `(N,)`
for N-way classification or `(L, F)` → `(D,)` for a prototypical-network embedding. Any
number of leading dimensions (windows, tasks) is carried through. Each model keeps its
last layer as the sub-module `head`, which is what ANIL adapts.

Importing this package registers the built-in models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

_REGISTRY: dict[str, type[nn.Module]] = {}


def register_model(name: str):
    """Class decorator registering an `nn.Module` class under `name`.

    The class is constructed as `cls(input_shape, output_shape, **options)`.

    Example:
        >>> @register_model("my_model")
        ... class MyModel(nn.Module): ...
    """

    def decorator(cls: type[nn.Module]) -> type[nn.Module]:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"@register_model({name!r}) needs an nn.Module subclass")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(
                f"model {name!r} is already registered by "
                f"{existing.__module__}.{existing.__qualname__}"
            )
        _REGISTRY[name] = cls
        return cls

    return decorator


def registered_models() -> list[str]:
    """Names of all registered models, sorted."""
    return sorted(_REGISTRY)


def get_model(name: str) -> type[nn.Module]:
    """The model class registered as `name`; `ValueError` listing the known names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(registered_models()) or "none"
        raise ValueError(f"unknown model {name!r}; registered: {known}") from None


def build_model(
    name: str, input_shape: Sequence[int], output_shape: Sequence[int], **options: Any
) -> nn.Module:
    """Builds the model registered as `name`.

    Args:
        name: registry name, e.g. "mlp", "forecaster", "tcn", "transformer", "gru".
        input_shape: shape of one example, e.g. `(1,)` or `(L, F)`.
        output_shape: shape of one prediction, e.g. `(1,)`, `(H, T)` or `(N,)`.
        **options: model options (hidden sizes, ...), validated by the model.

    Raises:
        ValueError: unknown name, shapes the model cannot serve, or a bad option.
    """
    cls = get_model(name)
    return cls(
        tuple(_check_shape(name, "input_shape", input_shape)),
        tuple(_check_shape(name, "output_shape", output_shape)),
        **options,
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


from metadist.models import forecaster, gru, mlp, tcn, transformer  # noqa: E402, F401

__all__ = ["build_model", "get_model", "register_model", "registered_models"]
