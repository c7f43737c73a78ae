"""Features of one series, for choosing forecast weights from them (FFORMA's inputs).

`series_features(y, period)` describes a history by a few scale-free numbers, as the
meta-learner of FFORMA (Montero-Manso et al., 2020) does with the `tsfeatures` package:
its length and period, the strength of its trend and of its season (a classical
decomposition: centred moving average, then the mean detrended value per position in the
season), how spiky its remainder is, its autocorrelations, curvature, variation, and how
much better the seasonal naive than the naive forecast fits it in-sample. Every feature
is finite whatever the series (constant, a single value, zeros): degenerate cases give
the feature's neutral value, never NaN.
"""

from __future__ import annotations

import numpy as np

FEATURE_NAMES = (
    "log_length",
    "log_period",
    "trend_strength",
    "seasonal_strength",
    "spikiness",
    "acf1",
    "diff_acf1",
    "seasonal_acf",
    "curvature",
    "variation",
    "last_level",
    "seasonal_naive_gain",
    "constant",
)
NUM_FEATURES = len(FEATURE_NAMES)
# Features are clipped to +-this: one extreme series must not dominate a linear model.
_CLIP = 10.0


# variance of a standardised series' parts below which they are rounding, not signal
_ROUNDING = 1e-10


def series_features(y: np.ndarray, period: int) -> np.ndarray:
    """`[NUM_FEATURES]` features of the series `y [n]` with seasonal period `period`
    (names in `FEATURE_NAMES`), all finite.

    Raises:
        ValueError: an empty series or a period below 1.
    """
    y = np.asarray(y, dtype=np.float64).ravel()
    y = y[np.isfinite(y)]
    if period < 1:
        raise ValueError(f"period must be >= 1, got {period}")
    if len(y) == 0:
        raise ValueError("series_features needs at least one finite value")
    n = len(y)
    spread = float(np.std(y))
    constant = not spread > 1e-12 * max(1.0, float(np.abs(y).max()))
    values = dict.fromkeys(FEATURE_NAMES, 0.0)
    values["log_length"] = float(np.log(n))
    values["log_period"] = float(np.log(period))
    values["constant"] = float(constant)
    if not constant:
        z = (y - y.mean()) / spread
        trend, seasonal, remainder = _decompose(z, period)
        values["trend_strength"] = _strength(remainder, trend + remainder)
        values["seasonal_strength"] = _strength(remainder, seasonal + remainder)
        values["spikiness"] = _spikiness(remainder)
        values["acf1"] = _acf(z, 1)
        values["diff_acf1"] = _acf(np.diff(z), 1)
        values["seasonal_acf"] = _acf(z, period) if period > 1 else 0.0
        values["curvature"] = _curvature(trend)
        mean = abs(float(y.mean()))
        values["variation"] = float(np.log1p(spread / mean)) if mean > 0 else _CLIP
        values["last_level"] = float(z[-1])
        values["seasonal_naive_gain"] = _seasonal_naive_gain(z, period)
    out = np.array([values[name] for name in FEATURE_NAMES])
    return np.clip(np.nan_to_num(out, nan=0.0, posinf=_CLIP, neginf=-_CLIP), -_CLIP, _CLIP)


def features_of(histories: list[np.ndarray], periods: list[int]) -> np.ndarray:
    """`[N, NUM_FEATURES]` features of the first column of each history `[t, T]` (or `[t]`)."""
    rows = [
        series_features(np.asarray(h, np.float64).reshape(len(h), -1)[:, 0], p)
        for h, p in zip(histories, periods, strict=True)
    ]
    return np.stack(rows) if rows else np.zeros((0, NUM_FEATURES))


def _decompose(z: np.ndarray, period: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(trend, seasonal, remainder)` of the standardised series `z`, on the points where
    the trend is defined: the trend a centred moving average (order `period`, 2×m for even
    m; order 3 without a season), the seasonal part the mean detrended value per position
    in the season (fewer than two seasons: none). Too short for the average: the trend is
    the mean, over every point."""
    n = len(z)
    order = period if period > 1 else 3
    if n < order + 1:
        trend, offset, kept = np.full(n, z.mean()), 0, z
    else:
        weights = (
            np.full(order, 1.0 / order)
            if order % 2
            else np.r_[0.5, np.ones(order - 1), 0.5] / order
        )
        trend = np.convolve(z, weights, mode="valid")
        offset = len(weights) // 2
        kept = z[offset : offset + len(trend)]
    detrended = kept - trend
    seasonal = np.zeros(len(kept))
    if period > 1 and len(kept) >= 2 * period:
        position = (np.arange(len(kept)) + offset) % period
        means = np.array([detrended[position == p].mean() for p in range(period)])
        seasonal = (means - means.mean())[position]
    return trend, seasonal, detrended - seasonal


def _strength(remainder: np.ndarray, with_component: np.ndarray) -> float:
    """max(0, 1 - var(remainder) / var(component + remainder)) (Wang, Smith & Hyndman).

    The series is standardised (variance 1), so a component and remainder whose variance
    is under 1e-10 are rounding (a straight line's detrended values): no strength, rather
    than a ratio of two roundings, which changes with the library's summation order."""
    total = float(np.var(with_component))
    if not total > _ROUNDING:
        return 0.0
    return max(0.0, 1.0 - float(np.var(remainder)) / total)


def _spikiness(remainder: np.ndarray) -> float:
    """The largest absolute remainder in its own standard deviations (log1p)."""
    spread = float(np.std(remainder))
    if not spread > 0:
        return 0.0
    return float(np.log1p(np.abs(remainder - remainder.mean()).max() / spread))


def _acf(z: np.ndarray, lag: int) -> float:
    """The autocorrelation of `z` at `lag` (0 where undefined)."""
    if len(z) <= lag:
        return 0.0
    centred = z - z.mean()
    denominator = float(centred @ centred)
    if not denominator > 0:
        return 0.0
    return float(centred[lag:] @ centred[:-lag]) / denominator


def _curvature(trend: np.ndarray) -> float:
    """The quadratic coefficient of a fit to the trend over t in [-1, 1]."""
    if len(trend) < 3:
        return 0.0
    t = np.linspace(-1.0, 1.0, len(trend))
    return float(np.polyfit(t, trend, 2)[0])


def _seasonal_naive_gain(z: np.ndarray, period: int) -> float:
    """log(in-sample MAE of naive / of seasonal naive): > 0 where the season helps."""
    if period < 2 or len(z) <= period:
        return 0.0
    naive = float(np.abs(np.diff(z)).mean())
    seasonal = float(np.abs(z[period:] - z[:-period]).mean())
    if not (naive > 0 and seasonal > 0):
        return 0.0
    return float(np.log(naive / seasonal))
