"""The built-in models' base (`ConfigurableModel`), option checks and shape handling."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from metadist.options import Configurable


class ConfigurableModel(nn.Module, Configurable):
    """Base of the built-in models: an `nn.Module` whose options are its nested frozen
    `Options` dataclass, kept typed as `self.options` (`metadist.options.Configurable`).

    Its constructor is `cls(input_shape, output_shape, options=None, **keywords)`: the
    options as one typed object (what `build_model` passes) or as keywords.
    """

    options_path = "model.options"
    options_label = "model"


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


WINDOW_NORMS = ("none", "last", "mean")


def window_norm_options(
    model: str,
    mode: str,
    target_channels: Sequence[int] | None,
    input_shape: tuple[int, ...],
    output_shape: tuple[int, ...],
    modes: Sequence[str] = WINDOW_NORMS,
) -> tuple[str, tuple[int, ...] | None]:
    """Validated `(window_norm, target_channels)` for a window model that offers `modes`.

    `target_channels[t]` is the input feature (the position of the column in the sampler's
    `input_columns`) that holds target `t` (`target_columns[t]`). It may be left out only
    when the window has one feature and one target.

    Raises:
        ValueError: an unknown mode; a window-normalised model whose output is not `(H, T)`;
            target channels missing (for more than one feature or target), of the wrong
            length, repeated or outside `[0, F)`.
    """
    if mode not in modes:
        raise ValueError(
            f"model {model!r}: window_norm must be one of {', '.join(modes)}, got {mode!r}"
        )
    if mode == "none":
        return mode, None
    _, num_features = window_shape(model, input_shape)
    if len(output_shape) != 2:
        raise ValueError(
            f"model {model!r}: window_norm={mode!r} forecasts targets in the window's units, so "
            f"output_shape must be (H, T), got {output_shape!r}; set window_norm: none"
        )
    num_targets = output_shape[1]
    if target_channels is None:
        if num_features == num_targets == 1:
            return mode, (0,)
        raise ValueError(
            f"model {model!r}: window_norm={mode!r} with {num_features} input features and "
            f"{num_targets} targets needs target_channels: the input feature index of each "
            f"target (positions of target_columns in input_columns)"
        )
    channels = tuple(int(c) for c in target_channels)
    if (
        len(channels) != num_targets
        or len(set(channels)) != len(channels)
        or any(not 0 <= c < num_features for c in channels)
    ):
        raise ValueError(
            f"model {model!r}: target_channels must be {num_targets} distinct input feature "
            f"indices in [0, {num_features}), one per target, got {list(target_channels)!r}"
        )
    return mode, channels


def normalise_window(
    model: str, x: Tensor, input_shape: tuple[int, ...], mode: str, channels: tuple[int, ...]
) -> tuple[Tensor, Tensor, Tensor]:
    """Each window's target channels relative to the window's own level and scale.

    The level of a channel is its last value (`mode="last"`) or its mean over the window
    (`mode="mean"`); the scale is the root-mean-square deviation from that level, clamped
    below at `1e-5 · (1 + mean |x|)` so flat windows stay finite. Other channels pass
    unchanged. Only the window itself is used, so no value after it leaks in, and the
    map is equivariant: `a · x + b` (a > 0) gives the same normalised window.

    Args:
        x: windows `[..., L, F]`.
        input_shape: `(L, F)`.
        mode: "last" or "mean".
        channels: the input feature of each of the T targets.

    Returns:
        `(normalised [..., L, F], level [..., T], scale [..., T])`; a forecast `y [..., H, T]`
        in normalised units maps back with `denormalise_forecast(y, level, scale)`.

    Raises:
        ValueError: inputs whose trailing dims differ from `input_shape`.
    """
    split_leading(model, x, input_shape)
    num_features = input_shape[1]
    identity = channels == tuple(range(num_features))
    target = x if identity else x[..., list(channels)]  # [..., L, T]
    level = target[..., -1, :] if mode == "last" else target.mean(dim=-2)
    deviation = target - level.unsqueeze(-2)
    # the RMS deviation floored at 1e-5 · reference, its squares taken relative to the
    # reference so that values as large as float32 holds stay finite (as SeasonalNorm)
    reference = 1.0 + target.abs().mean(dim=-2)
    relative = (deviation / reference.unsqueeze(-2)).pow(2).mean(dim=-2)
    scale = reference * torch.sqrt(relative.clamp_min(1e-10))
    if identity:
        return deviation / scale.unsqueeze(-2), level, scale
    # Level/scale per input feature: the target's for its channel, 0/1 for the others.
    onehot = torch.zeros(len(channels), num_features, dtype=x.dtype, device=x.device)
    rows = torch.arange(len(channels), device=x.device)
    onehot[rows, torch.tensor(channels, device=x.device)] = 1.0
    feature_level = level @ onehot
    feature_scale = (scale - 1.0) @ onehot + 1.0
    return (x - feature_level.unsqueeze(-2)) / feature_scale.unsqueeze(-2), level, scale


def denormalise_forecast(y: Tensor, level: Tensor, scale: Tensor) -> Tensor:
    """`y [..., H, T]` in window-normalised units → the window's units: `y · scale + level`."""
    return torch.addcmul(level.unsqueeze(-2), y, scale.unsqueeze(-2))
