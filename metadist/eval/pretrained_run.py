"""The pretrained-embedding baseline's backbone of a run (classification).

`pretrained_backbone` trains a fresh network of the run's architecture as an ordinary
classifier of its meta-train classes (`baselines.pretrain_embedding`), or takes it from
the run's `EvalCache` when it was trained from the same settings, store, split and
initial weights. In a sharded evaluation rank 0 trains (or loads) it, while the other
ranks start predicting, and scores it (`metadist.eval.shard`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from metadist.eval import baselines
from metadist.eval.cache import CACHE_VERSION, EvalCache, digest, model_digest
from metadist.eval.settings import EvalOptions
from metadist.eval.shard import EvalShard
from metadist.progress import Progress
from metadist.train.config import TrainConfig


def pretrained_backbone(
    config: TrainConfig,
    options: EvalOptions,
    parts: Any,  # metadist.eval.run.EvalParts
    build_fresh: Callable[..., nn.Module],
    progress: bool | None,
    cache: EvalCache,
    shard: EvalShard,
) -> nn.Module | None:
    """The backbone of the pretrained-embedding classification baseline, trained as an
    ordinary classifier of the meta-train classes (or taken from `cache`, trained from
    the same settings, store, split and initial weights); `None` where it does not
    apply; on a sharded evaluation's other ranks, `None` (rank 0 scores it)."""
    tasks = parts.tasks
    if options.pretrain_steps <= 0 or tasks.labelled_examples is None:
        return None
    embedding_size = int(np.prod(config.model.output_shape or [64]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(options.seed)
        backbone = build_fresh((embedding_size,))
    if not shard.is_main:  # a sharded evaluation scores it on rank 0 only
        return None
    return _trained_backbone(config, options, parts, backbone, progress, cache)


def _trained_backbone(
    config: TrainConfig,
    options: EvalOptions,
    parts: Any,  # metadist.eval.run.EvalParts
    backbone: nn.Module,
    progress: bool | None,
    cache: EvalCache,
) -> nn.Module:
    """`backbone` pretrained (or loaded from `cache`)."""
    tasks = parts.tasks
    assert tasks.num_classes is not None and tasks.labelled_examples is not None
    embedding_size = int(np.prod(config.model.output_shape or [64]))
    settings = {
        "steps": options.pretrain_steps,
        "lr": options.pretrain_lr,
        "batch_size": options.pretrain_batch_size,
        "seed": options.seed,
        "embedding_size": embedding_size,
        "num_classes": tasks.num_classes,
    }
    key = digest(
        "pretrained",
        CACHE_VERSION,
        settings,
        model_digest(backbone),
        parts.store_identity,
        parts.train_units,
        config.sampler.name,
        dict(config.sampler.options),
        options.sampler_options,
        # the first batch it trains on: what the examples are, whatever produced them
        *tasks.labelled_examples(options.pretrain_batch_size, options.seed * 1_000_003),
    )
    if cache.load_pretrained(key, backbone):
        return backbone.eval()
    with Progress(progress, transient=True) as display:
        shown = display.counter("pretrained embedding", options.pretrain_steps, "steps")
        baselines.pretrain_embedding(
            backbone,
            tasks.labelled_examples,
            num_classes=tasks.num_classes,
            embedding_size=embedding_size,
            steps=options.pretrain_steps,
            lr=options.pretrain_lr,
            batch_size=options.pretrain_batch_size,
            seed=options.seed,
            on_step=lambda step, loss: shown.update(step, f"loss {loss:.3f}"),
        )
    cache.save_pretrained(key, backbone, settings)
    return backbone
