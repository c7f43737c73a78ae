"""Baselines scored next to the adapted model, on the same tasks.

- `naive_forecast`: the last observed value, repeated over the horizon.
- `seasonal_naive_forecast`: the value one season earlier, repeated season by season.
- `theta_forecast`: the Theta method of the M3 competition (Assimakopoulos and
  Nikolopoulos, 2000), as the standard reproduction computes it (Hyndman and Billah,
  2003): deseasonalise when the seasonal autocorrelation is significant, simple
  exponential smoothing with half the linear trend as drift, reseasonalise.
- `naive2_forecast`: the naive forecast of the seasonally adjusted series (M4's Naive 2,
  the yardstick of OWA).
- `ets_forecast`: AutoETS from statsforecast (optional: the `ets` extra).
- the meta-trained model without adaptation: the learner's parameters before the inner
  loop (`evaluate.py` gets them from `learner.adapt(support, steps=0)`);
- `fit_from_scratch` (`metadist.eval.scratch`): the same network, freshly initialised by
  the caller, trained on each task's support set only (no meta-learning), with Adam, all
  tasks of a batch at once.

Few-shot classification, on the same episodes:

- `nearest_centroid_scores`: nearest class centroid of the z-normalised raw examples;
- `one_nn_scores`: 1-nearest-neighbour, Euclidean distance of the z-normalised examples;
- from scratch: the same backbone with one output per way, trained on each support set
  (`fit_from_scratch` with cross-entropy);
- `pretrain_embedding` + `embedding_centroid_scores`: the backbone trained as an ordinary
  classifier of the meta-train classes, then nearest class centroid of its features on
  the new classes (Chen et al. 2019, Tian et al. 2020);
- Baseline++ (`metadist.eval.baseline_pp.cosine_classifier_scores`): that backbone frozen,
  a cosine-similarity classifier with a learned scale fine-tuned on each support set
  (Chen et al. 2019).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from metadist.eval.baseline_pp import cosine_classifier_scores
from metadist.eval.scratch import fit_from_scratch, predict_stacked
from metadist.train.pretrain import pretrain_classifier

__all__ = [
    "centroid_scores",
    "cosine_classifier_scores",
    "embedding_centroid_scores",
    "ets_forecast",
    "fit_from_scratch",
    "naive2_forecast",
    "naive_forecast",
    "nearest_centroid_scores",
    "nearest_neighbour_scores",
    "one_nn_scores",
    "predict_stacked",
    "pretrain_embedding",
    "raw_examples",
    "seasonal_indices",
    "seasonal_naive_forecast",
    "theta_forecast",
    "z_normalise",
]


def naive_forecast(history, horizon: int) -> np.ndarray:
    """Repeats the last value of `history` (`[n]` or `[n, T]`) `horizon` times.

    Returns:
        `[horizon]` or `[horizon, T]` float64.

    Raises:
        ValueError: an empty history or horizon < 1.
    """
    history = _history(history, horizon)
    return np.repeat(history[-1:], horizon, axis=0)


def seasonal_naive_forecast(history, horizon: int, seasonal_period: int) -> np.ndarray:
    """ŷ_{n+h} = x_{n+h−m·k}, k the smallest integer putting the index inside the history.

    With m = 1 (or a history shorter than one season) this is the naive forecast.

    Returns:
        `[horizon]` or `[horizon, T]` float64.

    Raises:
        ValueError: an empty history, horizon < 1 or seasonal_period < 1.
    """
    history = _history(history, horizon)
    m = _period(seasonal_period)
    if history.shape[0] < m:
        m = 1
    last_season = history[history.shape[0] - m :]
    return last_season[np.arange(horizon) % m]


# Smoothing constants tried by `theta_forecast` (the initial level is solved exactly).
_SES_ALPHAS = np.linspace(0.01, 1.0, 100)
_Z_90 = 1.6448536269514722  # one-sided 95 % normal quantile: the 90 % two-sided test


def theta_forecast(history, horizon: int, seasonal_period: int) -> np.ndarray:
    """The Theta method's forecast of `history` (`[n]` or `[n, T]`, each column alone).

    1. Seasonality (`seasonal_indices`): with m > 1 and n ≥ 2m + 1, the series is seasonal
       when its lag-m autocorrelation r_m passes the 90 % test
       |r_m| > 1.645·sqrt((1 + 2·Σ_{k<m} r_k²) / n); it is then adjusted by the indices of
       a classical decomposition: multiplicative (divided) when every value is positive,
       additive (subtracted) otherwise, as statsmodels' Theta model decides.
    2. Simple exponential smoothing of the adjusted series: the smoothing constant
       α from a grid of 0.01 .. 1 and the initial level, solved exactly for each α,
       minimise the one-step squared errors.
    3. Drift: ŷ_{n+h} = ℓ_n + (b/2)·(h − 1 + (1 − (1 − α)^n)/α), b the least-squares slope
       of the adjusted series on time (the theta = 0 line, extrapolated, averaged with the
       theta = 2 line, smoothed); the seasonal indices put back when seasonal.

    With one value of history this is the naive forecast.

    Returns:
        `[horizon]` or `[horizon, T]` float64.

    Raises:
        ValueError: an empty history, horizon < 1 or seasonal_period < 1.
    """
    return _per_column(_theta_column, history, horizon, seasonal_period)


def naive2_forecast(history, horizon: int, seasonal_period: int) -> np.ndarray:
    """Naive 2 of the M4 competition: the naive forecast of the seasonally adjusted series,
    the seasonal indices put back (`seasonal_indices`, as the Theta method adjusts); the
    yardstick of OWA.

    Returns:
        `[horizon]` or `[horizon, T]` float64.
    """
    return _per_column(_naive2_column, history, horizon, seasonal_period)


def _per_column(method, history, horizon: int, seasonal_period: int) -> np.ndarray:
    history = _history(history, horizon)
    m = _period(seasonal_period)
    if history.ndim == 2:
        columns = [method(history[:, t], int(horizon), m) for t in range(history.shape[1])]
        return np.stack(columns, axis=1)
    return method(history, int(horizon), m)


def _adjust(y: np.ndarray, m: int) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """(seasonally adjusted y, a function putting the indices back on a forecast)."""
    found = seasonal_indices(y, m)
    n = len(y)
    if found is None:
        return y, lambda forecast: forecast
    indices, kind = found

    def ahead(forecast: np.ndarray) -> np.ndarray:  # the indices of the steps after y
        return indices[(n + np.arange(len(forecast))) % m]

    if kind == "multiplicative":
        return y / indices[np.arange(n) % m], lambda f: f * ahead(f)
    return y - indices[np.arange(n) % m], lambda f: f + ahead(f)


def _theta_column(y: np.ndarray, horizon: int, m: int) -> np.ndarray:
    n = len(y)
    y, reseasonalise = _adjust(y, m)
    level, alpha = _ses(y)
    slope = np.polyfit(np.arange(n), y, 1)[0] if n > 1 else 0.0
    steps = np.arange(horizon, dtype=np.float64)
    forecast = level + slope / 2 * (steps + (1 - (1 - alpha) ** n) / alpha)
    return reseasonalise(forecast)


def _naive2_column(y: np.ndarray, horizon: int, m: int) -> np.ndarray:
    adjusted, reseasonalise = _adjust(y, m)
    return reseasonalise(np.full(horizon, adjusted[-1]))


def seasonal_indices(y, m: int) -> tuple[np.ndarray, str] | None:
    """`([m] seasonal indices by position t % m, kind)` of a classical decomposition, or
    None when `y` is not seasonal at the 90 % level (or too short: n < 2m + 1, or flat).

    The trend is the centred moving average of order m (2×m for even m); kind is
    "multiplicative" when every value is positive (indices: mean ratio of value to trend
    per position, normalised to mean 1), else "additive" (mean difference, normalised to
    mean 0).
    """
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    if m < 2 or n < 2 * m + 1 or np.ptp(y) == 0:
        return None
    centred = y - y.mean()
    r = np.array([centred[k:] @ centred[: n - k] for k in range(1, m + 1)]) / (centred @ centred)
    limit = _Z_90 * np.sqrt((1 + 2 * np.sum(r[:-1] ** 2)) / n)
    if abs(r[-1]) <= limit:
        return None
    # centred moving average of order m; for even m, 2×m: the season's two ends half-weighted
    weights = np.full(m, 1.0 / m) if m % 2 else np.r_[0.5, np.ones(m - 1), 0.5] / m
    trend = np.convolve(y, weights, mode="valid")  # trend[i] centres on y[i + half]
    half = len(weights) // 2
    position = (np.arange(len(trend)) + half) % m
    if np.all(y > 0):
        ratios = y[half : half + len(trend)] / trend
        indices = np.array([ratios[position == p].mean() for p in range(m)])
        return indices / indices.mean(), "multiplicative"
    differences = y[half : half + len(trend)] - trend
    indices = np.array([differences[position == p].mean() for p in range(m)])
    return indices - indices.mean(), "additive"


def ets_forecast(history, horizon: int, seasonal_period: int) -> np.ndarray:
    """AutoETS (statsforecast, the `ets` extra): the exponential smoothing state-space
    model chosen by AICc, seasonal with period m when m > 1 and the history holds two
    seasons; each target column alone. A series no model fits gets its naive forecast.

    Raises:
        ImportError: statsforecast is not installed (naming the extra).
    """
    try:
        from statsforecast.models import AutoETS
    except ImportError:
        raise ImportError(
            "the ETS baseline needs statsforecast: pip install 'metadist[ets]'"
        ) from None

    def column(y: np.ndarray, h: int, m: int) -> np.ndarray:
        season = m if m > 1 and len(y) >= 2 * m else 1
        try:
            # the fit's own numerical warnings (a zero-degree-of-freedom variance, say)
            # are not the user's business: a forecast that is not finite is replaced below
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                fitted = AutoETS(season_length=season).forecast(y=y.astype(np.float64), h=h)
            forecast = np.asarray(fitted["mean"], dtype=np.float64)
        except Exception:  # no admissible model for this series
            return np.full(h, y[-1])
        return forecast if np.isfinite(forecast).all() else np.full(h, y[-1])

    return _per_column(column, history, horizon, seasonal_period)


def _ses(y: np.ndarray) -> tuple[float, float]:
    """(final level, α) of simple exponential smoothing fitted by least squares.

    For each α the one-step forecast before y_t is c_t + (1 − α)^t·ℓ_0, c_t being the
    forecast from ℓ_0 = 0, so the best ℓ_0 solves a one-variable least-squares problem.
    """
    alphas = _SES_ALPHAS
    n = len(y)
    decay = (1 - alphas)[:, None] ** np.arange(n + 1)  # [A, n + 1]
    c = np.zeros((len(alphas), n + 1))  # forecasts from a zero initial level
    for t in range(n):
        c[:, t + 1] = alphas * y[t] + (1 - alphas) * c[:, t]
    residual = y - c[:, :n]  # [A, n]: errors are residual - decay·ℓ_0
    d = decay[:, :n]
    denominator = (d * d).sum(axis=1)
    level0 = np.where(denominator > 0, (residual * d).sum(axis=1) / denominator, 0.0)
    sse = ((residual - d * level0[:, None]) ** 2).sum(axis=1)
    best = int(np.argmin(sse))
    return float(c[best, n] + decay[best, n] * level0[best]), float(alphas[best])


def _period(seasonal_period) -> int:
    m = int(seasonal_period)
    if m < 1:
        raise ValueError(f"seasonal_period must be >= 1, got {seasonal_period}")
    return m


def _history(history, horizon: int) -> np.ndarray:
    history = np.asarray(history, dtype=np.float64)
    if history.ndim == 0 or history.shape[0] == 0:
        raise ValueError("a naive forecast needs at least one value of history")
    if int(horizon) < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    return history


# Few-shot classification baselines. Each returns scores `[B, Q, N]` (higher is more
# likely) for the query examples of B N-way tasks, so they are scored like a model's logits.


def z_normalise(x: Tensor, eps: float = 1e-8) -> Tensor:
    """Each example `[..., L, F]` scaled to zero mean and unit variance per feature over
    its L steps (a constant feature becomes all zeros)."""
    x = x.to(torch.float64)
    mean = x.mean(dim=-2, keepdim=True)
    std = x.std(dim=-2, unbiased=False, keepdim=True)
    return (x - mean) / torch.where(std > eps, std, torch.ones_like(std))


def _flat(x: Tensor) -> Tensor:
    """`[B, M, ...]` → `[B, M, D]`."""
    return x.reshape(x.shape[0], x.shape[1], -1)


def centroid_scores(
    support_features: Tensor, support_y: Tensor, query_features: Tensor, num_ways: int
) -> Tensor:
    """Negative squared Euclidean distance of each query feature vector to each class's
    mean support feature vector: `[B, Q, N]`.

    Args:
        support_features: `[B, S, D]`; support_y: `[B, S]` int64 in `[0, N)`;
        query_features: `[B, Q, D]`.
    """
    one_hot = torch.nn.functional.one_hot(support_y.long(), num_ways).to(support_features.dtype)
    counts = one_hot.sum(1).clamp_min(1).unsqueeze(-1)  # [B, N, 1]
    centroids = one_hot.transpose(1, 2) @ support_features / counts  # [B, N, D]
    return -torch.cdist(query_features, centroids).pow(2)


def raw_examples(x: Tensor, normalise: bool = True) -> Tensor:
    """`[B, M, D]` float64 raw examples of `x [B, M, ...]`, each z-normalised over its own
    rows when `normalise`: the features of the raw-example classifiers (computed once a
    batch for both of them)."""
    return _flat(z_normalise(x) if normalise else x.to(torch.float64))


def nearest_centroid_scores(
    support_x: Tensor, support_y: Tensor, query_x: Tensor, num_ways: int, normalise: bool = True
) -> Tensor:
    """Nearest class centroid of the z-normalised raw examples (no learning): `[B, Q, N]`.

    `normalise=False` takes examples the sampler already z-normalised as whole cases
    (before resampling them: `nway_kshot`'s `z_normalise`) as they are.
    """
    return centroid_scores(
        raw_examples(support_x, normalise), support_y, raw_examples(query_x, normalise), num_ways
    )


def one_nn_scores(
    support_x: Tensor, support_y: Tensor, query_x: Tensor, num_ways: int, normalise: bool = True
) -> Tensor:
    """1-nearest-neighbour (Euclidean distance of the z-normalised raw examples): `[B, Q, N]`
    with 1 for the class of each query's nearest support example and 0 elsewhere (ties go
    to the first support example); `normalise` as for `nearest_centroid_scores`."""
    return nearest_neighbour_scores(
        raw_examples(support_x, normalise), support_y, raw_examples(query_x, normalise), num_ways
    )


def nearest_neighbour_scores(
    support_features: Tensor, support_y: Tensor, query_features: Tensor, num_ways: int
) -> Tensor:
    """1-NN in a feature space: `[B, Q, N]` with 1 for the class of each query's nearest
    support feature vector (Euclidean; ties to the first) and 0 elsewhere.

    Args:
        support_features: `[B, S, D]`; support_y: `[B, S]` int64 in `[0, N)`;
        query_features: `[B, Q, D]`.
    """
    distances = torch.cdist(query_features, support_features)
    nearest = distances.argmin(-1)  # [B, Q]
    labels = torch.gather(support_y.long(), 1, nearest)
    return torch.nn.functional.one_hot(labels, num_ways).to(torch.float64)


def pretrain_embedding(
    backbone: nn.Module,
    examples: Callable[[int, int], tuple[Tensor, Tensor]],
    *,
    num_classes: int,
    embedding_size: int,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> nn.Module:
    """Trains `backbone` as an ordinary classifier of the meta-train classes (the
    "pretrained embedding" baseline of Chen et al. 2019 and Tian et al. 2020).

    A linear head `embedding_size → num_classes` is put on the backbone and both are
    trained with cross-entropy and Adam for `steps` batches of `batch_size` labelled
    examples (`examples(num, seed) -> (x [num, ...], class [num])`); the head is then
    dropped and the backbone, whose outputs are the features, returned in eval mode
    (`metadist.train.pretrain.pretrain_classifier`, which can also save and resume).
    `on_step(step, loss)` is called every 1 % of the steps (progress).

    Raises:
        ValueError: steps < 1, fewer than 2 classes, or a backbone whose output is not
            `[..., embedding_size]`.
    """
    pretrain_classifier(
        backbone,
        examples,
        num_classes=num_classes,
        embedding_size=embedding_size,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        name="pretrained-embedding baseline",
        save_every=max(1, int(steps) // 100),  # no state_path: only `on_step` is called
        on_save=on_step,
    )
    return backbone.eval()


def embedding_centroid_scores(
    backbone: nn.Module, support_x: Tensor, support_y: Tensor, query_x: Tensor, num_ways: int
) -> Tensor:
    """Nearest class centroid in the features of a (pretrained) backbone: `[B, Q, N]`."""
    with torch.no_grad():
        return centroid_scores(
            backbone(support_x).to(torch.float64),
            support_y,
            backbone(query_x).to(torch.float64),
            num_ways,
        )
