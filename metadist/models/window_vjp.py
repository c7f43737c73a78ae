"""The windowed forecaster's backward written out (`WindowForecaster.batched_vjp`): the
MLP's (`metadist.models.mlp_vjp`) through the window's output map.

The forecaster normalises each window before its MLP and maps the MLP's output `o`
`[..., H, T]` back to the data's units. The normalisation of the input has no
parameters, so the parameters' gradients need only the derivative of the output map
w.r.t. `o`, and that map is elementwise and affine in `o` for a given window:

- "last" / "mean": `forecast = level + o · scale`, so `d forecast / d o = scale`;
- "seasonal": `forecast = (level + o · scale) · s_mult + s_add`, then (with a clamp)
  `max(min(forecast, high), low)`: `d forecast / d o = scale · s_mult` where the clamp
  is not active and 0 where it is (half at a tie, as autograd's `minimum` / `maximum`).

So `dL/d o = dL/d forecast · slope` with the slope `[..., H, T]` (or `[..., 1, T]`) a
constant of the window and the clamp's mask: the MLP's written-out backward runs on that,
and the result stays an ordinary differentiable function of the parameters (second
order: the map is piecewise linear in `o`, its second derivative 0, as autograd's).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import Tensor

from metadist.models._common import denormalise_forecast
from metadist.models.mlp_vjp import VJP
from metadist.models.seasonal import SeasonalNorm, SeasonalState


@dataclass(frozen=True)
class AffineMap:
    """The output map of window_norm "last" / "mean": `o · scale + level`.

    Attributes:
        level, scale: `[..., T]` per window (`normalise_window`).
    """

    level: Tensor
    scale: Tensor

    def restore(self, output: Tensor) -> Tensor:
        """`output [..., H, T]` in the window's units."""
        return denormalise_forecast(output, self.level, self.scale)

    def restore_with_slope(self, output: Tensor) -> tuple[Tensor, Tensor]:
        """`(restore(output), d restore / d output)`, the slope `[..., 1, T]`."""
        return self.restore(output), self.scale.unsqueeze(-2)


@dataclass(frozen=True)
class SeasonalMap:
    """The output map of window_norm "seasonal" (`SeasonalNorm.restore`)."""

    norm: SeasonalNorm
    state: SeasonalState

    def restore(self, output: Tensor) -> Tensor:
        """`output [..., H, T]` in the window's units (and clamped)."""
        return self.norm.restore(output, self.state)

    def restore_with_slope(self, output: Tensor) -> tuple[Tensor, Tensor]:
        """`(restore(output), d restore / d output)`, the slope `[..., H, T]`: `scale ·
        s_mult`, times the clamp's mask (0 where clamped, 1/2 at a tie, 1 elsewhere: the
        gradient autograd gives `minimum` and `maximum`, a NaN passing as there)."""
        state = self.state
        slope = state.scale.unsqueeze(-2) * state.multiplier
        if state.low is None or state.high is None:
            return self.norm.restore(output, state), slope
        unclamped = self.norm.restore(output, state._replace(low=None, high=None))
        high, low = state.high.unsqueeze(-2), state.low.unsqueeze(-2)
        capped = torch.minimum(unclamped, high)
        forecast = torch.maximum(capped, low)
        with torch.no_grad():  # piecewise constant: no gradient of its own
            mask = _tie_mask(unclamped, high, unclamped > high)
            mask = mask * _tie_mask(capped, low, capped < low)
        return forecast, slope * mask


def _tie_mask(value: Tensor, bound: Tensor, beyond: Tensor) -> Tensor:
    """1 where `value` is within `bound`, 1/2 where equal to it, 0 `beyond` it."""
    inside = torch.where(value == bound, 0.5, 1.0).to(value.dtype)
    return inside.masked_fill(beyond, 0.0)


WindowMap = AffineMap | SeasonalMap


def window_vjp(output: Tensor, mlp_vjp: VJP, window: WindowMap) -> tuple[Tensor, VJP]:
    """The forecast and its written-out backward, from the MLP's.

    Args:
        output: the MLP's output `[B, ..., H, T]` on the normalised windows.
        mlp_vjp: its backward (`MLP.batched_vjp`).
        window: the windows' output map.

    Returns:
        The forecast `[B, ..., H, T]` and `vjp(grad_forecast, names)`: the gradients
        `[B, *shape]` of `(forecast * grad_forecast).sum()` w.r.t. the parameters `names`,
        differentiable again under grad mode.
    """
    forecast, slope = window.restore_with_slope(output)

    def vjp(grad_forecast: Tensor, names: Collection[str]) -> dict[str, Tensor]:
        return mlp_vjp(grad_forecast * slope, names)

    return forecast, vjp
