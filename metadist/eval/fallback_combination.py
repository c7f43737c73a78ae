"""A model's forecast shrunk towards a simple fallback by one weight learned on validation.

Where a meta-trained model does worse than a simple method (seasonal naive, say) on the
series of one group (a frequency), the forecast `w · model + (1 − w) · fallback` with one
weight `w` in [0, 1] for the whole group keeps the model where it helps and falls back
where it does not. `fit_shrinkage` chooses `w` on a grid (`WEIGHTS`) by the pooled
metric of the shrunk forecast on forecasts whose truth the caller may use for choosing
(a validation protocol's holdout, never the evaluated one); ties keep the larger weight
(the model). `pooled_score` pools a metric as the evaluation's tables do: a task's points
summed, tasks with an undefined sum (MAPE where a value is 0, MASE without a scale) left
out, the sum over the rest divided by their points.
"""

from __future__ import annotations

import numpy as np

from metadist.eval import metrics

# the weights of the model tried, from the fallback alone (0) to the model alone (1)
WEIGHTS = tuple(round(0.1 * k, 1) for k in range(11))
# the metrics a weight can be chosen by
SCORED = metrics.POINT_METRICS


def pooled_score(terms: np.ndarray, tasks: np.ndarray) -> float:
    """The pooled metric of point `terms [P]` of the tasks `tasks [P]` (any labels): each
    task's sum, a non-finite one left out with its points; NaN where none is left."""
    _, sums, counts = task_point_sums(terms, tasks)
    return metrics.pool(sums, counts)


def task_point_sums(
    terms: np.ndarray, tasks: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(tasks [T], sums [T], counts [T])`: each task of `tasks [P]` once (sorted), the
    sum of its point `terms [P]` (NaN where one of them is not finite) and its number of
    points, as `pooled_score` pools them."""
    terms = np.asarray(terms, np.float64)
    names, index = np.unique(np.asarray(tasks), return_inverse=True)
    sums = np.bincount(index, weights=np.where(np.isfinite(terms), terms, 0.0))
    bad = np.bincount(index, weights=(~np.isfinite(terms)).astype(np.float64)) > 0
    counts = np.bincount(index).astype(np.float64)
    return names, np.where(bad, np.nan, sums), counts


def shrunk(model: np.ndarray, fallback: np.ndarray, weight: float) -> np.ndarray:
    """`weight · model + (1 − weight) · fallback`; the fallback where the model is not
    finite."""
    model, fallback = np.asarray(model, np.float64), np.asarray(fallback, np.float64)
    mixed = weight * model + (1.0 - weight) * fallback
    return np.where(np.isfinite(model), mixed, fallback)


def fit_shrinkage(
    metric: str,
    truth: np.ndarray,
    model: np.ndarray,
    fallback: np.ndarray,
    tasks: np.ndarray,
    scale: np.ndarray | None = None,
) -> tuple[float, dict[float, float]]:
    """The weight of `WEIGHTS` whose shrunk forecast scores best by `metric`.

    Args:
        metric: one of `SCORED` (the data set's metric).
        truth, model, fallback: `[P]` the points' values and the two forecasts.
        tasks: `[P]` which task (series) each point belongs to.
        scale: `[P]` MASE's scale of each point's task (MASE only).

    Returns:
        `(weight, {weight: pooled score})`; the larger weight on a tie, 1 (the model)
        where no score is finite.

    Raises:
        ValueError: arrays of different lengths, or `metrics.point_terms`'s.
    """
    lengths = {len(np.asarray(a)) for a in (truth, model, fallback, tasks)}
    if len(lengths) != 1:
        raise ValueError("fit_shrinkage: truth, model, fallback and tasks differ in length")
    scores = {
        w: pooled_score(
            metrics.point_terms(metric, truth, shrunk(model, fallback, w), scale), tasks
        )
        for w in WEIGHTS
    }
    finite = {w: s for w, s in scores.items() if np.isfinite(s)}
    if not finite:
        return 1.0, scores
    best = min(finite, key=lambda w: (finite[w], -w))
    return best, scores
