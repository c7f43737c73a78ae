"""Scoring regression tasks as sampled: MSE and MAE of each method's query predictions."""

from __future__ import annotations

import numpy as np

from metadist.batch import MetaBatch
from metadist.eval import metrics
from metadist.eval.task_scores import TaskScores, diverged


def score_regression(
    scores: TaskScores, batch: MetaBatch, predictions: dict[str, np.ndarray]
) -> None:
    """Adds the batch's tasks to `scores`: `predictions {method: [B, Q, T]}` against
    `query.y [B, Q, T]`; a prediction diverged when it explodes relative to the task's
    support targets."""
    truth = batch.query.y.cpu().numpy().astype(np.float64)
    support = batch.support.y.cpu().numpy().astype(np.float64)
    for b in range(truth.shape[0]):
        failed = {m: diverged(predictions[m][b], support[b]) for m in scores.methods}
        sums = {
            method: {
                "mse": float(metrics.squared_errors(truth[b], predictions[method][b]).sum()),
                "mae": float(metrics.absolute_errors(truth[b], predictions[method][b]).sum()),
            }
            for method in scores.methods
        }
        scores.add(sums, truth[b].size, {}, failed)
