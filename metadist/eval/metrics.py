"""Forecast and classification metrics, computed in float64 on the host.

Forecast metrics are point-wise errors averaged over the forecast horizon (and target
columns) of each task; `pool` then combines tasks the way the forecasting competitions
do, as the mean over every forecast point of every task (a task with a longer horizon
weighs more, as in the M3 and M4 tables). `mean_ci` gives the mean over tasks with a
normal-approximation 95% confidence interval, which is how few-shot classification
accuracy is reported.

Definitions (y: truth, ŷ: forecast, h: horizon, m: seasonal period):

- MSE  = 1/h · Σ (y − ŷ)²
- MAE  = 1/h · Σ |y − ŷ|
- sMAPE (M4) = 200/h · Σ |y − ŷ| / (|y| + |ŷ|), a 0/0 term counting as 0
- MAPE = 100/h · Σ |y − ŷ| / |y|, undefined (nan) when some y is 0
- MASE = (1/h · Σ |y − ŷ|) / (1/(n − m) · Σ_{t=m}^{n−1} |x_t − x_{t−m}|), where x is the
  entity's in-sample history of length n (the seasonal-naive error on the history)
- OWA (M4) = ½ · (sMAPE / sMAPE of naive 2 + MASE / MASE of naive 2), of the pooled
  values (`metadist.eval.scoring`), naive 2 being the naive forecast of the seasonally
  adjusted series

Besides the pooled mean over all points, every summary carries the mean of per-series
errors (`task_mean`), the other aggregate the competitions report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z_95 = 1.959963984540054  # two-sided 95% quantile of the standard normal
# the point-wise forecast metrics (`point_terms`), in the order the tables give them
POINT_METRICS = ("smape", "mape", "mase", "mae", "mse")


def _pair(y_true, y_pred) -> tuple[np.ndarray, np.ndarray]:
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"y_true and y_pred must have the same shape, got {y_true.shape} and {y_pred.shape}"
        )
    if y_true.size == 0:
        raise ValueError("metrics need at least one forecast point, got an empty array")
    return y_true, y_pred


def squared_errors(y_true, y_pred) -> np.ndarray:
    """Point-wise (y − ŷ)², same shape as the inputs."""
    y_true, y_pred = _pair(y_true, y_pred)
    return (y_true - y_pred) ** 2


def absolute_errors(y_true, y_pred) -> np.ndarray:
    """Point-wise |y − ŷ|, same shape as the inputs."""
    y_true, y_pred = _pair(y_true, y_pred)
    return np.abs(y_true - y_pred)


def smape_terms(y_true, y_pred) -> np.ndarray:
    """Point-wise 200 · |y − ŷ| / (|y| + |ŷ|) (0 where y = ŷ = 0), same shape as the inputs;
    nan where either is nan (a missing forecast is not a perfect one)."""
    y_true, y_pred = _pair(y_true, y_pred)
    denominator = np.abs(y_true) + np.abs(y_pred)
    numerator = np.abs(y_true - y_pred)
    safe = np.where(denominator > 0, denominator, 1.0)
    return np.where(denominator == 0, 0.0, 200.0 * numerator / safe)


def ape_terms(y_true, y_pred) -> np.ndarray:
    """Point-wise 100 · |y − ŷ| / |y|, same shape as the inputs; nan where y = 0 (MAPE is
    undefined there: a task with such a point has no MAPE, and pooling leaves it out)."""
    y_true, y_pred = _pair(y_true, y_pred)
    size = np.abs(y_true)
    safe = np.where(size > 0, size, 1.0)
    return np.where(size > 0, 100.0 * np.abs(y_true - y_pred) / safe, np.nan)


def mape(y_true, y_pred, axis=None) -> np.ndarray | float:
    """Mean absolute percentage error in percent over `axis` (all by default); nan where
    a truth value is 0.

    Example: y = [100, 200], ŷ = [110, 180] gives 100 · (10/100 + 20/200) / 2 = 10.
    """
    return _mean(ape_terms(y_true, y_pred), axis)


def mse(y_true, y_pred, axis=None) -> np.ndarray | float:
    """Mean squared error over `axis` (all axes by default)."""
    return _mean(squared_errors(y_true, y_pred), axis)


def mae(y_true, y_pred, axis=None) -> np.ndarray | float:
    """Mean absolute error over `axis` (all axes by default)."""
    return _mean(absolute_errors(y_true, y_pred), axis)


def smape(y_true, y_pred, axis=None) -> np.ndarray | float:
    """Symmetric MAPE, M4 definition, in percent, averaged over `axis` (all by default).

    Example: y = [100, 200], ŷ = [110, 180] gives 100 · (10/210 + 20/380) ≈ 10.03.
    """
    return _mean(smape_terms(y_true, y_pred), axis)


def seasonal_scale(history, seasonal_period: int = 1) -> np.ndarray | float:
    """MASE's denominator: the mean absolute seasonal difference of the history.

    Args:
        history: in-sample values `[n]` or `[n, T]` (one scale per target column).
        seasonal_period: m ≥ 1; m = 1 is the one-step naive scale.

    Returns:
        `1/(n − m) · Σ_{t≥m} |x_t − x_{t−m}|`, a float (or `[T]`). Zero for a history that
        repeats exactly with period m, in which case MASE is undefined (nan).

    Raises:
        ValueError: m < 1, or a history with n ≤ m values.
    """
    history = np.asarray(history, dtype=np.float64)
    m = int(seasonal_period)
    if m < 1:
        raise ValueError(f"seasonal_period must be >= 1, got {seasonal_period}")
    if history.ndim == 0 or history.shape[0] <= m:
        length = 0 if history.ndim == 0 else history.shape[0]
        raise ValueError(
            f"MASE with seasonal_period={m} needs a history longer than {m} values, got {length}"
        )
    diffs = np.abs(history[m:] - history[:-m])
    return diffs.mean(axis=0)


def mase(y_true, y_pred, history, seasonal_period: int = 1) -> float:
    """Mean absolute scaled error of one task.

    Args:
        y_true, y_pred: `[h]` or `[h, T]` truth and forecast of one entity.
        history: `[n]` or `[n, T]` the entity's values before the forecast origin.
        seasonal_period: m of the scaling seasonal-naive forecast.

    Returns:
        MAE divided by `seasonal_scale(history, m)`, averaged over target columns;
        nan if the scale is zero.
    """
    errors = absolute_errors(y_true, y_pred)
    scale = np.asarray(seasonal_scale(history, seasonal_period), dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = errors.mean(axis=0) / scale
    scaled = np.where(scale > 0, scaled, np.nan)
    return float(np.mean(scaled))


def mean_ci(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Mean over tasks and the half-width of its 95% confidence interval.

    Uses the normal approximation `1.96 · s / √n` with the sample standard deviation s
    (ddof = 1); nan entries are left out. One value has no interval: a half-width of
    nan (the report shows the value alone), not 0, which would read as exact.

    Raises:
        ValueError: no finite value to average.
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    values = values[~np.isnan(values)]
    if values.size == 0:
        raise ValueError("mean_ci needs at least one value that is not nan")
    mean = float(values.mean())
    if values.size == 1:
        return mean, float("nan")
    return mean, float(Z_95 * values.std(ddof=1) / math.sqrt(values.size))


def accuracy_ci(predicted, target) -> tuple[float, float]:
    """Classification accuracy averaged over tasks, with its 95% confidence interval.

    Args:
        predicted: `[B, N]` predicted class indices (or `[B, N, C]` logits/scores).
        target: `[B, N]` true class indices.

    Returns:
        (mean accuracy over the B tasks, half-width of the 95% interval), as fractions.

    Raises:
        ValueError: shapes that do not match.
    """
    predicted = np.asarray(predicted)
    target = np.asarray(target)
    if predicted.ndim == target.ndim + 1:
        predicted = predicted.argmax(axis=-1)
    if predicted.shape != target.shape or target.ndim != 2:
        raise ValueError(
            f"accuracy_ci needs predicted [B, N] (or logits [B, N, C]) and target [B, N], "
            f"got {predicted.shape} and {target.shape}"
        )
    per_task = (predicted == target).mean(axis=1)
    return mean_ci(per_task)


def point_terms(metric: str, y_true, y_pred, scale=None) -> np.ndarray:
    """The terms of the point-wise `metric` (one of `POINT_METRICS`) at each point of
    `y_true`/`y_pred` (any shape); `scale` (broadcastable to them) is MASE's in-sample
    scale, its terms NaN where the scale is not positive.

    Raises:
        ValueError: a metric not in `POINT_METRICS`, or MASE without `scale`.
    """
    if metric not in POINT_METRICS:
        raise ValueError(f"metric must be one of {', '.join(POINT_METRICS)}, got {metric!r}")
    if metric == "smape":
        return smape_terms(y_true, y_pred)
    if metric == "mape":
        return ape_terms(y_true, y_pred)
    if metric == "mse":
        return squared_errors(y_true, y_pred)
    absolute = absolute_errors(y_true, y_pred)
    if metric == "mae":
        return absolute
    if scale is None:
        raise ValueError("MASE needs each point's scale")
    scale = np.asarray(scale, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, absolute / scale, np.nan)


def pool(point_sums: np.ndarray, point_counts: np.ndarray) -> float:
    """Pools per-task sums of a point-wise metric into its mean over all points.

    Tasks with a nan sum (an undefined MASE) are left out.
    """
    point_sums = np.asarray(point_sums, dtype=np.float64)
    point_counts = np.asarray(point_counts, dtype=np.float64)
    keep = ~np.isnan(point_sums)
    if not keep.any():
        return float("nan")
    return float(point_sums[keep].sum() / point_counts[keep].sum())


def _mean(values: np.ndarray, axis) -> np.ndarray | float:
    result = values.mean(axis=axis)
    return float(result) if np.ndim(result) == 0 else result
