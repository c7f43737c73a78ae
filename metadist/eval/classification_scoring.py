"""Scoring N-way classification episodes: accuracy, next to the non-meta-learned classifiers.

`classification_baselines` gives the nearest-centroid and 1-NN scores on the raw examples
(and, when there is a pretrained embedding, its nearest-centroid and Baseline++ scores;
Baseline++, which fine-tunes a classifier per episode, is kept in the run's `EvalCache`
for the next evaluation, as the from-scratch network is); `score_classification` counts each method's correct query predictions per episode.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from metadist.batch import MetaBatch
from metadist.eval import baseline_pp, baselines
from metadist.eval.cache import CACHE_VERSION, EvalCache, digest, model_digest
from metadist.eval.task_scores import TaskScores


def classification_baselines(
    batch: MetaBatch,
    pretrained: nn.Module | None,
    examples_normalised: bool = False,
    cache: EvalCache | None = None,
) -> dict[str, torch.Tensor]:
    """Scores `[B, Q, N]` of the non-meta-learned classifiers on the batch's episodes.

    `examples_normalised`: the sampler z-normalised each whole case already (before
    resampling it), so the raw-example classifiers do not normalise the examples again.
    `cache`: where Baseline++'s scores of the batch are taken from and kept.
    """
    support_x, support_y, query_x = batch.support.x, batch.support.y, batch.query.x
    num_ways = int(support_y.max()) + 1
    normalise = not examples_normalised
    # `nearest_centroid_scores` and `one_nn_scores`, on raw examples normalised once
    support, query = (baselines.raw_examples(x, normalise) for x in (support_x, query_x))
    out = {
        "nearest_centroid": baselines.centroid_scores(support, support_y, query, num_ways),
        "one_nn": baselines.nearest_neighbour_scores(support, support_y, query, num_ways),
    }
    if pretrained is not None:
        out["pretrained"] = baselines.embedding_centroid_scores(
            pretrained, support_x, support_y, query_x, num_ways
        )
        out["baseline_pp"] = _baseline_pp(pretrained, batch, num_ways, cache)
    return out


def _baseline_pp(
    backbone: nn.Module, batch: MetaBatch, num_ways: int, cache: EvalCache | None
) -> torch.Tensor:
    """Baseline++'s scores `[B, Q, N]` of the batch, from `cache` where it holds them
    (keyed by the backbone, the schedule and the episodes' tensors)."""
    support_x, support_y, query_x = batch.support.x, batch.support.y, batch.query.x
    key = None
    if cache is not None:
        schedule = (baseline_pp.STEPS, baseline_pp.LR, baseline_pp.INITIAL_SCALE)
        key = digest(
            "baseline_pp", CACHE_VERSION, model_digest(backbone), schedule, num_ways,
            support_x, support_y, query_x,
        )  # fmt: skip
        found = cache.get("Baseline++", key)
        if found is not None:
            return torch.from_numpy(found)
    scores = baselines.cosine_classifier_scores(backbone, support_x, support_y, query_x, num_ways)
    if cache is not None and key is not None:
        cache.put("Baseline++", key, scores)
    return scores


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
