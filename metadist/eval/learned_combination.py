"""A forecast combination whose weights are learned from each series' features (FFORMA).

FFORMA (Montero-Manso, Athanasopoulos, Hyndman & Talagala, 2020; second in M4) forecasts
a validation window at the end of each series' history with every candidate method,
describes the series by features, and learns a map from features to softmax weights
over the methods that minimises the weighted validation error `sum_m w_m(x) err_m`
across series; each series' forecast is then the weighted mean of the methods'
forecasts. Here the map is softmax-linear (numpy, a fixed number of Adam steps), fitted
to FFORMA's loss or to the error of the weighted forecast itself
(`metadist.eval.combination_loss`), the loss and its L2 penalty chosen on a seeded split
of the validation series, then refitted on all of them.

`fit_weight_model(features [N, D], errors [N, M])` learns it, `relative_errors` makes
the validation errors comparable across series, `weighted_forecast` combines. What
is fitted never sees the evaluated horizon: the caller passes only validation windows
(`metadist.eval.validation_window`), and `ForecastScorer` applies the weights to
the evaluated forecasts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from metadist.eval import metrics
from metadist.eval.combination_loss import CombinedLoss, weighted_loss

# A loss of the weights `[N, M]`: (value, gradient `[N, M]`).
Loss = Callable[[np.ndarray], tuple[float, np.ndarray]]

# The method name of the learned combination (scored and reported as a method of its own).
METHOD = "fforma"
# The default candidates, in order; `ets` joins where it is scored.
DEFAULT_CANDIDATES = ("adapted", "theta", "ets", "seasonal_naive", "naive")
# L2 penalties (on every coefficient, the intercepts too) tried on the validation split
# with each loss;
# `inf` is the plain mean of the candidates (every weight alike), so the fixed average
# is one of the choices.
PENALTIES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, np.inf)
# A series' relative error is clipped here (one method exploding on one series must not
# dominate the fit).
_MAX_ERROR = 10.0
_STEPS = 300
_LEARNING_RATE = 0.05
_HELD_OUT = 0.25  # share of the validation series that chooses the penalty
_MIN_SPLIT = 8  # fewer validation series than this: no split, the intercepts only


@dataclass
class WeightModel:
    """Softmax-linear weights over M methods from D features.

    Attributes:
        mean: `[D]` feature means of the series it was fitted on.
        scale: `[D]` their standard deviations (1 where constant).
        coef: `[D + 1, M]` the linear map of standardised features (last row: intercepts).
        penalty: the L2 penalty chosen on the validation split.
        loss: the loss fitted, chosen there too: `weighted` (FFORMA's) or `combined`.
        validation_loss: `{"<loss> <penalty>": its error on the held-out series}`.
    """

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    penalty: float
    loss: str
    validation_loss: dict[str, float]

    def describe_penalty(self) -> str | float:
        """The penalty as the report says it."""
        if np.isinf(self.penalty):
            return "every weight alike" if not self.coef.any() else "intercepts only"
        return self.penalty

    def weights(self, features: np.ndarray) -> np.ndarray:
        """`[N, M]` weights (rows sum to 1) of series with `features [N, D]`."""
        return _softmax(_design(features, self.mean, self.scale) @ self.coef)


def relative_errors(truth: np.ndarray, forecasts: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """`[N, M]` each method's error on each series, relative to the series' mean error.

    The error of a method is the mean of its sMAPE and its MASE (absolute errors over
    `scale`, where the scale is defined and positive), each divided by that metric's mean
    over the methods on the series, so that every series weighs alike; a method with
    a non-finite forecast gets the largest error; a series every method forecasts
    perfectly gets 1 for each.

    Args:
        truth: `[N, H, T]` the validation windows' values.
        forecasts: `[N, M, H, T]` each method's forecast of them.
        scale: `[N, T]` MASE's scale of each series' history before its window (NaN
            where undefined).
    """
    truth = truth[:, None]
    finite = np.isfinite(forecasts).all(axis=(2, 3))  # [N, M]
    safe = np.where(np.isfinite(forecasts), forecasts, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        smape = metrics.smape_terms(np.broadcast_to(truth, safe.shape), safe).mean(axis=(2, 3))
        absolute = np.abs(truth - safe)
        scaled = absolute / scale[:, None, None, :]
        mase = np.where(scale[:, None, None, :] > 0, scaled, np.nan).mean(axis=(2, 3))
    parts = [_relative(smape, finite), _relative(mase, finite)]
    usable = [p for p in parts if np.isfinite(p).any()]
    errors = np.nanmean(np.stack(usable), axis=0) if usable else np.ones(finite.shape)
    errors = np.where(np.isfinite(errors), errors, _MAX_ERROR)
    return np.where(finite, np.clip(errors, 0.0, _MAX_ERROR), _MAX_ERROR)


def _relative(error: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """`error [N, M]` over its mean across the finite methods of each row; 1 where that
    mean is 0 (every method perfect), NaN where the metric is undefined."""
    kept = np.where(finite & np.isfinite(error), error, np.nan)
    count = np.isfinite(kept).sum(axis=1, keepdims=True)
    total = np.nansum(kept, axis=1, keepdims=True)
    mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = kept / mean
    return np.where(mean == 0, 1.0, out)


def num_fits(num_series: int, combined: bool) -> int:
    """How many fits `fit_weight_model` makes for `num_series` validation series
    (`combined`: given the combined loss), for its progress."""
    if num_series < _MIN_SPLIT:
        return 1
    return (2 if combined else 1) * len(PENALTIES) + 1


def fit_weight_model(
    features: np.ndarray,
    errors: np.ndarray,
    seed: int = 0,
    combined: CombinedLoss | None = None,
    on_fit: Callable[[], None] | None = None,
) -> WeightModel:
    """Learns softmax-linear weights of M methods from D features of N series.

    The fitted loss is FFORMA's, `mean_i sum_m w_m(x_i) errors[i, m]`, and, with
    `combined`, also the error of the weighted forecast itself (`CombinedLoss`); which
    loss and which of `PENALTIES` are chosen on a seeded quarter of the series (fitted on
    the rest, scored by the combined forecast's error where `combined` is given, else by
    FFORMA's loss; ties: the stronger penalty); the model is then refitted on every
    series. With fewer than `_MIN_SPLIT` series only the intercepts are fitted (one
    weight vector for all, FFORMA's loss); with none, every method weighs alike.

    Args:
        features: `[N, D]` finite features of the validation series.
        errors: `[N, M]` each method's (relative) validation error on each series.
        seed: seed of the split.
        combined: the combined forecast's loss on the same N series' windows.
        on_fit: called after each fit (`num_fits` in all: progress).

    Raises:
        ValueError: shapes that do not match, or non-finite inputs.
    """
    features = np.asarray(features, np.float64)
    errors = np.asarray(errors, np.float64)
    if features.ndim != 2 or errors.ndim != 2 or len(features) != len(errors):
        raise ValueError(
            f"fit_weight_model needs features [N, D] and errors [N, M], got "
            f"{features.shape} and {errors.shape}"
        )
    if not (np.isfinite(features).all() and np.isfinite(errors).all()):
        raise ValueError("fit_weight_model: features and errors must be finite")
    num, num_features = features.shape
    mean = features.mean(axis=0) if num else np.zeros(num_features)
    scale = features.std(axis=0) if num else np.ones(num_features)
    scale = np.where(scale > 1e-12, scale, 1.0)
    design = _design(features, mean, scale)
    losses: dict[str, Callable[[np.ndarray], Loss]] = {
        "weighted": lambda rows: functools.partial(weighted_loss, errors=errors[rows])
    }
    if combined is not None:
        losses["combined"] = combined.subset
    fitted = on_fit or (lambda: None)
    if num < _MIN_SPLIT:
        everything = np.arange(num)
        coef = _fit(design, losses["weighted"](everything), None, errors.shape[1])
        fitted()
        return WeightModel(mean, scale, coef, float(np.inf), "weighted", {})
    order = np.random.default_rng(seed).permutation(num)
    held = order[: max(1, int(round(_HELD_OUT * num)))]
    kept = order[len(held) :]
    judge = losses["combined" if combined is not None else "weighted"](held)
    scores: dict[str, float] = {}
    for name, loss in losses.items():
        for penalty in PENALTIES:
            coef = _fit(design[kept], loss(kept), penalty, errors.shape[1])
            scores[f"{name} {penalty:g}"] = judge(_softmax(design[held] @ coef))[0]
            fitted()
    best = min(scores, key=lambda k: (scores[k], -float(k.split()[1])))
    name, penalty = best.split()[0], float(best.split()[1])
    coef = _fit(design, losses[name](np.arange(num)), penalty, errors.shape[1])
    fitted()
    return WeightModel(mean, scale, coef, penalty, name, scores)


def weighted_forecast(forecasts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`[N, H, T]` the weighted mean of `forecasts [N, M, H, T]` with `weights [N, M]`.
    Where a method with a positive weight forecast a series with a value that is not
    finite, the series' combination is NaN: reported as diverged, as the method is, not
    quietly the other methods' mean."""
    weighted = weights > 0
    finite = np.isfinite(forecasts).all(axis=(2, 3)) | ~weighted
    total = np.where(weighted, weights, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(weighted, weights, 0.0) / total[:, None]
    safe = np.where(np.isfinite(forecasts), forecasts, 0.0)
    out = np.einsum("nm,nmht->nht", share, safe)
    return np.where((finite.all(axis=1) & (total > 0))[:, None, None], out, np.nan)


def _design(features: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """`[N, D + 1]` standardised features and a column of ones."""
    standard = (np.asarray(features, np.float64) - mean) / scale
    return np.concatenate([standard, np.ones((len(standard), 1))], axis=1)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def _fit(design: np.ndarray, loss: Loss, penalty: float | None, num_methods: int) -> np.ndarray:
    """`[D + 1, M]` Adam, `_STEPS` full-batch steps from uniform weights, on `loss` plus
    `penalty` times the squared coefficients; an infinite penalty gives zeros (every
    weight alike), `None` fits the intercepts alone, unpenalised."""
    width = design.shape[1]
    coef = np.zeros((width, num_methods))
    if penalty is not None and np.isinf(penalty):
        return coef
    if penalty is None:
        design, coef = design[:, -1:], coef[-1:]
    first, second = np.zeros_like(coef), np.zeros_like(coef)
    beta1, beta2 = 0.9, 0.999
    for step in range(1, _STEPS + 1):
        weights = _softmax(design @ coef)
        _, by_weight = loss(weights)
        # through the softmax: d/dz_m = w_m (d/dw_m - sum_k w_k d/dw_k)
        by_logit = weights * (by_weight - (weights * by_weight).sum(axis=1, keepdims=True))
        grad = design.T @ by_logit
        if penalty is not None:
            grad += 2 * penalty * coef
        first = beta1 * first + (1 - beta1) * grad
        second = beta2 * second + (1 - beta2) * grad**2
        corrected = first / (1 - beta1**step), second / (1 - beta2**step)
        coef -= _LEARNING_RATE * corrected[0] / (np.sqrt(corrected[1]) + 1e-8)
    if penalty is None:
        full = np.zeros((width, num_methods))
        full[-1] = coef[0]
        return full
    return coef
