"""The learned combination's part of forecast scoring: validation forecasts in, weights out.

`ForecastScorer` hands `ValidationCollector` each batch's tasks: their histories cut
before the last H points (`metadist.eval.validation_window`), every candidate's forecast
of that window (the statistical methods' from the shortened histories, the meta-trained
model's adapted on the windows ending there), and the features of the shortened
histories. Once every batch is in, `fit` learns the features -> weights map
(`metadist.eval.learned_combination`) from those validation rows alone, and `combine`
weighs the candidates' forecasts of the evaluated horizon by the weights of each
series' features (of its whole history).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from metadist.eval import metrics
from metadist.eval.combination_loss import CombinedLoss
from metadist.eval.learned_combination import (
    METHOD,
    WeightModel,
    fit_weight_model,
    num_fits,
    relative_errors,
    weighted_forecast,
)
from metadist.eval.predictions import model_predictions
from metadist.eval.series_features import NUM_FEATURES, features_of
from metadist.eval.settings import EvalOptions
from metadist.eval.validation_window import model_validation_batch, validation_histories
from metadist.tasks.inference import ForecastWindows

__all__ = ["METHOD", "ValidationCollector", "learned_methods"]


def learned_methods(options: EvalOptions, scored: Sequence[str], kind: str) -> list[str]:
    """`["fforma"]` where `eval.learned_combination` asks for it, else `[]`.

    Raises:
        ValueError: a candidate that is not scored.
    """
    candidates = options.learned_combination
    if candidates is None:
        return []
    if kind != "forecast":
        return []  # refused before any work (`forecast_only.check_forecast_only`)
    unsupported = [m for m in candidates if m in ("scratch", "unadapted")]
    if unsupported:
        raise ValueError(
            f"eval.learned_combination: {unsupported[0]!r} cannot be a candidate (it has no "
            "forecast of the validation window); use adapted and the statistical methods"
        )
    missing = [m for m in candidates if m not in scored]
    if missing:
        raise ValueError(
            f"eval.learned_combination: {missing[0]!r} is not scored by this evaluation "
            "(ets needs eval.extra_baselines=[ets]; scratch needs a from-scratch baseline)"
        )
    return [METHOD]


class ValidationCollector:
    """Validation rows of the learned combination, gathered batch by batch.

    Args:
        candidates: the methods combined (`adapted` needs `learner` and `windows`).
        store: the `SeriesStore` of the tasks.
        options: evaluation settings (inner steps of the model's adaptation).
        learner: the meta-trained learner (its adapted forecasts of the windows).
        windows: the run's forecast windows; `None` leaves the model without validation
            forecasts (`adapted` is then dropped from the candidates).
    """

    def __init__(
        self,
        candidates: Sequence[str],
        store: Any,
        options: EvalOptions,
        learner: Any = None,
        windows: ForecastWindows | None = None,
    ) -> None:
        self.candidates = list(candidates)
        if "adapted" in self.candidates and (learner is None or windows is None):
            self.candidates.remove("adapted")
        self.store = store
        self.options = options
        self.learner = learner
        self.windows = windows
        self._features: list[np.ndarray] = []
        self._errors: list[np.ndarray] = []
        # each batch's validation windows: (truth [n, H, T], forecasts [n, M, H, T], scale)
        self._windows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.model: WeightModel | None = None
        self._weight_sums = np.zeros(len(self.candidates))
        self._num_weighted = 0

    def validation_jobs(
        self, histories: list[np.ndarray], horizon: int
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """`(shortened histories, truth [N, H, T], usable [N])` of a batch's histories."""
        return validation_histories(histories, horizon)

    def add(
        self,
        entities: Sequence[int],
        num_history: Sequence[int],
        periods: Sequence[int],
        validation: tuple[list[np.ndarray], np.ndarray, np.ndarray],
        statistical: list[dict[str, np.ndarray]],
        inverse: Any,
    ) -> None:
        """Adds a batch's validation rows: its tasks' features and candidates' errors.

        Args:
            entities: `[N]` store row of each task's entity.
            num_history: `[N]` rows of each entity's history.
            periods: `[N]` seasonal period of each task.
            validation: `validation_jobs`'s answer (shortened histories, truth, usable).
            statistical: the statistical forecasts of the shortened histories.
            inverse: `(scaled [N, 1, H, T], entity index [N, 1, 1]) -> original units`.
        """
        shortened, truth, usable = validation
        horizon = truth.shape[1]
        forecasts = {m: np.stack([s[m] for s in statistical]) for m in statistical[0]}
        rows = usable.copy()
        if "adapted" in self.candidates:
            forecasts["adapted"], has_model = self._model_forecasts(
                entities, num_history, horizon, truth.shape, inverse
            )
            rows &= has_model
        if not rows.any():
            return
        stacked = np.stack([forecasts[m][rows] for m in self.candidates], axis=1)
        scale = np.stack(
            [
                _scale(h, p, truth.shape[2])
                for h, p, r in zip(shortened, periods, rows, strict=True)
                if r
            ]
        )
        self._errors.append(relative_errors(truth[rows], stacked, scale))
        self._windows.append((truth[rows], stacked, scale))
        kept = [h for h, r in zip(shortened, rows, strict=True) if r]
        self._features.append(
            features_of(kept, [p for p, r in zip(periods, rows, strict=True) if r])
        )

    def num_fits(self) -> int:
        """How many fits `fit` makes (`learned_combination.num_fits`)."""
        return num_fits(self.num_rows, bool(self._windows))

    def fit(self, seed: int = 0, on_fit: Callable[[], None] | None = None) -> WeightModel:
        """Learns the weights from every validation row added (uniform without any);
        `on_fit` is called after each of its `num_fits` fits."""
        num = len(self.candidates)
        features = np.concatenate(self._features) if self._features else np.zeros((0, NUM_FEATURES))
        errors = np.concatenate(self._errors) if self._errors else np.zeros((0, num))
        combined = None
        if self._windows:
            truth, forecasts, scale = (np.concatenate(p) for p in zip(*self._windows, strict=True))
            combined = CombinedLoss(truth, forecasts, scale)
        self.model = fit_weight_model(features, errors, seed, combined, on_fit)
        return self.model

    @property
    def num_rows(self) -> int:
        """Validation series the weights are (to be) learned from."""
        return int(sum(len(e) for e in self._errors))

    def combine(
        self, histories: list[np.ndarray], periods: Sequence[int], forecasts: dict[str, np.ndarray]
    ) -> np.ndarray:
        """`[N, H, T]` the learned combination of `forecasts {method: [N, H, T]}` of the
        evaluated horizon, weighted by the features of the whole `histories`."""
        assert self.model is not None  # `fit` comes first
        weights = self.model.weights(features_of(histories, list(periods)))
        self._weight_sums += weights.sum(axis=0)
        self._num_weighted += len(weights)
        stacked = np.stack([forecasts[m] for m in self.candidates], axis=1)
        return weighted_forecast(stacked, weights)

    def summary(self) -> dict[str, Any]:
        """What the report says of the fit: the candidates, the validation series, the
        penalty chosen and each candidate's mean weight over the series combined."""
        model = self.model
        out: dict[str, Any] = {"candidates": self.candidates, "validation_series": self.num_rows}
        if model is not None:
            out["loss"] = model.loss
            out["penalty"] = model.describe_penalty()
        if self._num_weighted:
            mean = self._weight_sums / self._num_weighted
            out["mean_weights"] = {
                m: round(float(w), 3) for m, w in zip(self.candidates, mean, strict=True)
            }
        return out

    def _model_forecasts(
        self,
        entities: Sequence[int],
        num_history: Sequence[int],
        horizon: int,
        shape: tuple[int, ...],
        inverse: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`([N, H, T] the adapted model's forecasts of the windows (NaN where none),
        [N] bool where there is one)`."""
        assert self.windows is not None  # `adapted` is a candidate only with windows
        batch, rows = model_validation_batch(
            self.store, self.windows, entities, num_history, horizon
        )
        out = np.full(shape, np.nan)
        if batch is None:
            return out, rows
        predicted = model_predictions(self.learner, batch, self.options, unadapted=False)
        scaled = predicted["adapted"].detach().cpu().numpy().astype(np.float64)
        index = np.asarray(entities)[rows][:, None, None]
        out[rows] = inverse(scaled, index)[:, 0]
        return out, rows


def _scale(history: np.ndarray, period: int, num_targets: int) -> np.ndarray:
    """`[T]` MASE's scale of a shortened history (NaN where undefined)."""
    try:
        return np.asarray(metrics.seasonal_scale(history, period), np.float64).reshape(num_targets)
    except ValueError:
        try:  # shorter than a season: the one-step scale
            return np.asarray(metrics.seasonal_scale(history, 1), np.float64).reshape(num_targets)
        except ValueError:
            return np.full(num_targets, np.nan)
