"""Scoring N-way classification episodes: accuracy, next to the non-meta-learned classifiers.

`classification_baselines` gives the nearest-centroid and 1-NN scores on the raw examples
(and, when there is a pretrained embedding, its nearest-centroid and Baseline++ scores);
`score_classification` counts each method's correct query predictions per episode.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from metadist.batch import MetaBatch
from metadist.eval import baselines
from metadist.eval.task_scores import TaskScores


def classification_baselines(
    batch: MetaBatch, pretrained: nn.Module | None, examples_normalised: bool = False
) -> dict[str, torch.Tensor]:
    """Scores `[B, Q, N]` of the non-meta-learned classifiers on the batch's episodes.

    `examples_normalised`: the sampler z-normalised each whole case already (before
    resampling it), so the raw-example classifiers do not normalise the examples again.
    """
    support_x, support_y, query_x = batch.support.x, batch.support.y, batch.query.x
    num_ways = int(support_y.max()) + 1
    normalise = not examples_normalised
    out = {
        "nearest_centroid": baselines.nearest_centroid_scores(
            support_x, support_y, query_x, num_ways, normalise
        ),
        "one_nn": baselines.one_nn_scores(support_x, support_y, query_x, num_ways, normalise),
    }
    if pretrained is not None:
        out["pretrained"] = baselines.embedding_centroid_scores(
            pretrained, support_x, support_y, query_x, num_ways
        )
        out["baseline_pp"] = baselines.cosine_classifier_scores(
            pretrained, support_x, support_y, query_x, num_ways
        )
    return out


def score_classification(
    scores: TaskScores, batch: MetaBatch, predictions: dict[str, np.ndarray]
) -> None:
    """Adds the batch's episodes to `scores`: correct predictions of `predictions
    {method: [B, Q, N] scores}` against `query.y [B, Q]`; a method diverged on an episode
    where a score is not finite."""
    target = batch.query.y.cpu().numpy()
    for b in range(target.shape[0]):
        sums = {
            method: {"accuracy": float((predictions[method][b].argmax(-1) == target[b]).sum())}
            for method in scores.methods
        }
        failed = {m: not np.isfinite(predictions[m][b]).all() for m in scores.methods}
        scores.add(sums, target[b].size, {}, failed)
