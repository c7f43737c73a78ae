"""Seasonal window normalisation: each window's level and seasonal indices around a
global network (the ES-RNN recipe, Smyl 2020), estimated from the window alone.

For a window of lookback L and a seasonal period m (the target channels `y [..., L, T]`):

1. Padding. A leading run of one repeated value is the sampler's front padding (it
   repeats a series' first value; the run's last element is that first value itself,
   unless the value is 0, when the whole run counts as padding). The values from there
   on are the window's real part.
2. Seasonal indices, by classical decomposition over the real part: a centred moving
   average of order m (2×m for even m) is the trend; `y / trend` (multiplicative) or
   `y − trend` (additive) at each position, averaged per phase, normalised to mean 1
   (multiplicative) or mean 0 (additive). Multiplicative indices are used only where the
   window's real part is all positive (else the window's indices are additive), so zeros
   and negatives never divide. A window whose real part is shorter than 2m seasons, and
   every window when L < 2m or m = 1, has no seasonality (indices 1 and 0).
3. Level and scale of the deseasonalised window `z = (y − s_add) / s_mult`: the level is
   the mean of its last m values (its last value for m = 1 or L < 2m), the scale the
   root-mean-square deviation from the level (floored as in `normalise_window`).
4. The network reads `(z − level) / scale` (other input channels pass unchanged) and its
   `[..., H, T]` output `o` is mapped back to `(level + o · scale) · s_mult + s_add`, the
   indices continuing the window's phase after its end.
5. With `clamp=c`, forecasts are then kept within `[min − c·range, max + c·range]` of the
   real part's values (a hard clamp).

Phases are aligned to the window's end: position i has phase `(i − L) mod m` and forecast
step h (1..H) has phase `(h − 1) mod m`, so a purely seasonal window `y_t = a · s_{t mod m}`
with a network output of 0 (the level) is forecast as its seasonal naive forecast, and a
constant window as that constant. Everything is tensor algebra over the leading dims (no
loop over windows, nothing data-dependent in Python), so it runs under `vmap`,
`functional_call` and the models' batched paths alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

SEASONALITIES = ("multiplicative", "additive")


class SeasonalState(NamedTuple):
    """What `SeasonalNorm.restore` needs of each window (T: the target channels).

    Attributes:
        level, scale: `[..., T]`.
        multiplier, offset: `[..., H, T]` the seasonal indices of the forecast steps
            (multiplicative and additive: one of them is neutral for every window).
        low, high: `[..., T]` the clamp's bounds, or None without a clamp.
    """

    level: Tensor
    scale: Tensor
    multiplier: Tensor
    offset: Tensor
    low: Tensor | None
    high: Tensor | None


@dataclass(frozen=True)
class SeasonalNorm:
    """The seasonal normalisation of `[..., L, F]` windows forecasting `[..., H, T]`.

    Args:
        lookback: L.
        horizon: H.
        num_features: F.
        channels: the input feature of each of the T targets.
        period: m, the seasonal period (1: none; a window of L < 2m has none either).
        seasonality: "multiplicative" (for windows whose real values are all positive;
            additive for the others) or "additive".
        clamp: c, or None for no clamp.
    """

    lookback: int
    horizon: int
    num_features: int
    channels: tuple[int, ...]
    period: int = 1
    seasonality: str = "multiplicative"
    clamp: float | None = None

    @property
    def seasonal(self) -> bool:
        """Whether windows may have seasonal indices at all (m > 1 and L >= 2m)."""
        return self.period > 1 and self.lookback >= 2 * self.period

    def normalise(self, x: Tensor) -> tuple[Tensor, SeasonalState]:
        """The network's input and what `restore` needs.

        Args:
            x: `[..., L, F]`.

        Returns:
            `(normalised [..., L, F], state)`.
        """
        identity = self.channels == tuple(range(self.num_features))
        y = x if identity else x[..., list(self.channels)]  # [..., L, T]
        first_real = _first_real(y)  # [..., T]
        positions = torch.arange(self.lookback, device=x.device)
        real = positions[:, None] >= first_real.unsqueeze(-2)  # [..., L, T]
        multiplier, offset = self._indices(y, first_real, real)  # [..., m, T] each
        to_window = _phase_matrix(
            (positions - self.lookback) % self.period, self.period, x.dtype
        )  # [L, m]
        to_future = _phase_matrix(
            torch.arange(self.horizon, device=x.device) % self.period, self.period, x.dtype
        )  # [H, m]
        z = (y - to_window @ offset) / (to_window @ multiplier)
        level = z[..., -(self.period if self.seasonal else 1) :, :].mean(dim=-2)
        deviation = z - level.unsqueeze(-2)
        # the RMS deviation, floored at 1e-5 · reference (computed relative to the
        # reference, so that squares of values as large as 1e30 stay finite in float32)
        reference = 1.0 + z.abs().mean(dim=-2)
        relative = (deviation / reference.unsqueeze(-2)).pow(2).mean(dim=-2)
        scale = reference * torch.sqrt(relative.clamp_min(1e-10))
        low = high = None
        if self.clamp is not None:
            big = torch.finfo(x.dtype).max
            top = torch.where(real, y, torch.full_like(y, -big)).amax(dim=-2)
            bottom = torch.where(real, y, torch.full_like(y, big)).amin(dim=-2)
            margin = self.clamp * (top - bottom)
            low, high = bottom - margin, top + margin
        state = SeasonalState(level, scale, to_future @ multiplier, to_future @ offset, low, high)
        normalised = deviation / scale.unsqueeze(-2)
        if identity:
            return normalised, state
        onehot = torch.zeros(len(self.channels), self.num_features, dtype=x.dtype, device=x.device)
        rows = torch.arange(len(self.channels), device=x.device)
        onehot[rows, torch.tensor(self.channels, device=x.device)] = 1.0
        return x * (1.0 - onehot.sum(dim=0)) + normalised @ onehot, state

    def restore(self, output: Tensor, state: SeasonalState) -> Tensor:
        """The network's output `[..., H, T]` in the window's units (and clamped)."""
        level, scale = state.level.unsqueeze(-2), state.scale.unsqueeze(-2)
        forecast = torch.addcmul(level, output, scale) * state.multiplier + state.offset
        if state.low is None or state.high is None:
            return forecast
        return torch.maximum(
            torch.minimum(forecast, state.high.unsqueeze(-2)), state.low.unsqueeze(-2)
        )

    def _indices(self, y: Tensor, first_real: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
        """Multiplicative and additive indices `[..., m, T]` per window (1 and 0 where a
        window has none of that kind), from `y [..., L, T]`, the index of its first real
        value `[..., T]` and the mask of its real values `[..., L, T]`."""
        shape = (*y.shape[:-2], self.period, y.shape[-1])
        ones, zeros = y.new_ones(shape), y.new_zeros(shape)
        if not self.seasonal:
            return ones, zeros
        m, length = self.period, self.lookback
        width = m + 1 if m % 2 == 0 else m  # the centred moving average's span
        half = width // 2
        centres = length - width + 1
        band = _moving_average(length, m, width, y.dtype, y.device)  # [C, L]
        starts = torch.arange(centres, device=y.device)
        complete = starts[:, None] >= first_real.unsqueeze(-2)  # [..., C, T]
        observed = y[..., half : half + centres, :]
        enough = (length - first_real) >= 2 * m  # [..., T]
        positive = torch.where(real, y > 0, torch.ones_like(real)).all(dim=-2) & enough
        if self.seasonality == "additive":
            positive = torch.zeros_like(positive)
        by_phase = _phase_matrix((starts + half - length) % m, m, y.dtype).T  # [m, C]
        counts = (by_phase @ complete.to(y.dtype)).clamp_min(1.0)  # [..., m, T]
        # Multiplicative: ratios to the trend, computed on safe values where unused so
        # that neither the forward nor the backward pass meets a zero division.
        trend = band @ torch.where(real & positive.unsqueeze(-2), y, torch.ones_like(y))
        use = complete & positive.unsqueeze(-2)
        ratios = torch.where(use, observed / torch.where(use, trend, torch.ones_like(trend)), 0.0)
        multiplier = (by_phase @ ratios) / counts
        mean = multiplier.mean(dim=-2, keepdim=True)
        usable = positive.unsqueeze(-2)
        multiplier = torch.where(usable, multiplier / torch.where(usable, mean, 1.0), ones)
        # Additive: differences from the trend, for the windows not multiplicative.
        additive = (enough & ~positive).unsqueeze(-2)
        differences = torch.where(complete, observed - band @ y, 0.0)
        offset = (by_phase @ differences) / counts
        offset = torch.where(additive, offset - offset.mean(dim=-2, keepdim=True), zeros)
        return multiplier, offset


def _first_real(y: Tensor) -> Tensor:
    """`[..., T]` int64: the index of each window's first real value (see the module
    docstring: the last element of the leading run of its first value, or the element
    after it where that value is 0; at most L − 1)."""
    length = y.shape[-2]
    run = torch.cumprod((y == y[..., :1, :]).to(torch.int64), dim=-2).sum(dim=-2)  # >= 1
    zero_start = (y[..., 0, :] == 0).to(torch.int64)
    return torch.clamp(run - 1 + zero_start, max=length - 1)


def _phase_matrix(phases: Tensor, period: int, dtype: torch.dtype) -> Tensor:
    """`[N, m]` one-hot rows of `phases [N]`."""
    return (phases[:, None] == torch.arange(period, device=phases.device)).to(dtype)


def _moving_average(
    length: int, period: int, width: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """`[C, L]`: row c averages positions c..c+width-1 (the centred moving average of
    order m, with half weights at both ends for even m), C = L − width + 1."""
    weights = torch.full((width,), 1.0 / period, dtype=dtype, device=device)
    if width != period:
        weights[0] = weights[-1] = 0.5 / period
    centres = length - width + 1
    lag = (
        torch.arange(length, device=device)[None, :] - torch.arange(centres, device=device)[:, None]
    )
    inside = (lag >= 0) & (lag < width)
    return torch.where(
        inside, weights[lag.clamp(0, width - 1)], torch.zeros((), dtype=dtype, device=device)
    )
