"""The losses a learned forecast combination's weights are fitted to, with their gradients.

Both are means over series of a relative error (each series weighs alike: its errors are
divided by the candidates' mean error on it, as `learned_combination.relative_errors`
does), given the weights `w [N, M]` of N series over M candidate methods:

- `weighted_loss` is FFORMA's: `sum_m w_m err_m`, the expected error of a method drawn
  with the weights. It is linear in the weights, so it rewards choosing one method.
- `CombinedLoss` is the error of the combined forecast itself, `sum_m w_m f_m`: the mean
  of its sMAPE and its MASE on the validation window, each relative to the candidates'
  mean. It is convex in the weights and rewards averaging methods whose errors cancel.

Each returns `(loss, dloss/dw [N, M])`.
"""

from __future__ import annotations

import numpy as np

from metadist.eval import metrics


def weighted_loss(weights: np.ndarray, errors: np.ndarray) -> tuple[float, np.ndarray]:
    """FFORMA's loss `mean_i sum_m w_im errors_im` and its gradient."""
    num = max(len(weights), 1)
    return float((weights * errors).sum(axis=1).mean()) if len(weights) else 0.0, errors / num


class CombinedLoss:
    """The relative error of the weighted forecast of validation windows.

    Args:
        truth: `[N, H, T]` the windows' values.
        forecasts: `[N, M, H, T]` each candidate's forecast of them (non-finite ones are
            read as 0: give them no weight).
        scale: `[N, T]` MASE's scale of each series (NaN where undefined).
    """

    def __init__(self, truth: np.ndarray, forecasts: np.ndarray, scale: np.ndarray) -> None:
        self.truth = truth
        self.forecasts = np.where(np.isfinite(forecasts), forecasts, 0.0)
        finite = np.isfinite(forecasts).all(axis=(2, 3))
        points = truth[0].size if len(truth) else 1
        with np.errstate(divide="ignore", invalid="ignore"):
            smape = metrics.smape_terms(
                np.broadcast_to(truth[:, None], self.forecasts.shape), self.forecasts
            ).mean(axis=(2, 3))
            absolute = np.abs(truth[:, None] - self.forecasts)
            mase = (absolute / scale[:, None, None, :]).mean(axis=(2, 3))
        self.inv_scale = np.where(scale > 0, 1.0 / np.where(scale > 0, scale, 1.0), 0.0)
        # per series: each metric's weight, 1 / (its candidates' mean * points * metrics)
        smape_norm = _mean_over(smape, finite)
        mase_norm = np.where(np.isfinite(scale).all(axis=1), _mean_over(mase, finite), np.nan)
        usable = np.stack([smape_norm > 0, mase_norm > 0])
        count = np.maximum(usable.sum(axis=0), 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.smape_weight = np.where(usable[0], 1.0 / (smape_norm * points * count), 0.0)
            self.mase_weight = np.where(usable[1], 1.0 / (mase_norm * points * count), 0.0)
        self.constant = ~usable.any(axis=0)  # every candidate perfect: loss 1, no gradient

    def __call__(self, weights: np.ndarray) -> tuple[float, np.ndarray]:
        """`(mean relative error of the combined forecasts, its gradient [N, M])`."""
        num = max(len(weights), 1)
        combined = np.einsum("nm,nmht->nht", weights, self.forecasts)
        error = self.truth - combined
        size = np.abs(self.truth) + np.abs(combined)
        safe = np.where(size > 0, size, 1.0)
        smape = np.where(size > 0, 200.0 * np.abs(error) / safe, 0.0)
        mase = np.abs(error) * self.inv_scale[:, None, :]
        per_series = (
            smape.sum(axis=(1, 2)) * self.smape_weight + mase.sum(axis=(1, 2)) * self.mase_weight
        )
        per_series = np.where(self.constant, 1.0, per_series)
        # d smape / d combined and d mase / d combined, point by point
        d_smape = np.where(
            size > 0,
            200.0 * (-np.sign(error) * size - np.abs(error) * np.sign(combined)) / safe**2,
            0.0,
        )
        d_mase = -np.sign(error) * self.inv_scale[:, None, :]
        d_combined = (
            d_smape * self.smape_weight[:, None, None] + d_mase * self.mase_weight[:, None, None]
        )
        grad = np.einsum("nht,nmht->nm", d_combined, self.forecasts) / num
        return float(per_series.mean()) if len(weights) else 0.0, grad

    def subset(self, rows: np.ndarray) -> CombinedLoss:
        """The loss of the series at `rows` only."""
        out = object.__new__(CombinedLoss)
        for name, value in vars(self).items():
            setattr(out, name, value[rows])
        return out


def _mean_over(values: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """`[N]` the mean of `values [N, M]` over each row's finite candidates (NaN: none)."""
    kept = np.where(finite & np.isfinite(values), values, 0.0)
    count = (finite & np.isfinite(values)).sum(axis=1)
    return np.where(count > 0, kept.sum(axis=1) / np.maximum(count, 1), np.nan)
