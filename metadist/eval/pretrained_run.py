"""The pretrained-embedding baseline's backbone of a run (classification).

`pretrained_backbone` trains a fresh network of the run's architecture as an ordinary
classifier of its meta-train classes (`baselines.pretrain_embedding`), or takes it from
the run's `EvalCache` when it was trained from the same settings, store, split and
initial weights: by this run's earlier evaluation, or by any other run's on the same store
and split (the shared cache, `metadist.eval.shared_cache`).

Where the run itself began with classifier pre-training (`pretrain.steps`, its state in
`run_dir/pretrain.pt`) of the baseline's learning rate and batch size, its model an
embedding network of the baseline's size, and no more steps than the baseline's, the
baseline is that pre-training continued to `eval.pretrain_steps` (`fork_run_pretraining`):
the meta-learner and the baseline then share their first `pretrain.steps` steps exactly
(the same initial weights, batches and classes), and differ only in how the rest of the
budget is spent: meta-training for the one, more classifier steps for the other (such a
fork is the run's own: it is kept in the run's directory, not shared with other runs). A run
whose pre-training does not fit (other settings, an inner-loop learner's head-input
features, a moved run directory) gets the fresh network as before. In a sharded evaluation rank 0 trains (or loads) it, while the other
ranks start predicting, and scores it (`metadist.eval.shard`).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
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
from metadist.train.pretrain import PRETRAIN_STATE, pretrain_classifier


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
    state_path = _run_directory(config, cache) / PRETRAIN_STATE
    fork = fork_settings(state_path, backbone, settings, config.pretrain.steps)
    if fork is not None:
        settings.update(fork)
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
    # a fork continues this run's own pre-training: no other run shares it
    shared = fork is None
    if cache.load_pretrained(key, backbone, shared=shared):
        return backbone.eval()
    with Progress(progress, transient=True) as display:
        shown = display.counter("pretrained embedding", options.pretrain_steps, "steps")

        def report(step: int, loss: float) -> None:
            shown.update(step, f"loss {loss:.3f}")

        if fork is not None:
            fork_run_pretraining(
                state_path,
                backbone,
                tasks.labelled_examples,
                settings,
                on_step=report,
            )
        else:
            baselines.pretrain_embedding(
                backbone,
                tasks.labelled_examples,
                num_classes=tasks.num_classes,
                embedding_size=embedding_size,
                steps=options.pretrain_steps,
                lr=options.pretrain_lr,
                batch_size=options.pretrain_batch_size,
                seed=options.seed,
                on_step=report,
            )
    cache.save_pretrained(key, backbone, settings, shared=shared)
    return backbone


def _run_directory(config: TrainConfig, cache: EvalCache) -> Path:
    """The evaluated run's directory: the cache's parent (`evaluate_run` keeps it in
    `run_dir/eval`), else the config's (a run evaluated without a cache, not moved)."""
    if cache.directory is not None:
        return cache.directory.parent
    return config.resolved_run_dir


def fork_settings(
    state_path: Path, backbone: nn.Module, settings: dict[str, Any], run_steps: int
) -> dict[str, Any] | None:
    """What the baseline takes from a run's classifier pre-training state at `state_path`
    (`{"seed": its seed, "forked_at": its step, "forked_from": its sha256}`), or `None`
    where it cannot continue it: no such file (or `run_steps` is 0), another format,
    learning rate, batch size, class count or embedding size than the baseline's
    `settings`, more steps than the baseline's, or a model `backbone` cannot load (an
    inner-loop learner pre-trains the features its head receives, not an embedding)."""
    if run_steps <= 0 or not state_path.is_file():
        return None
    data = state_path.read_bytes()
    try:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception:  # not a state this code can continue: the fresh baseline
        return None
    if not isinstance(state, dict) or not isinstance(state.get("settings"), dict):
        return None
    saved = state["settings"]
    same = ("num_classes", "embedding_size", "lr", "batch_size")
    if any(saved.get(k) != settings[k] for k in same) or int(state["step"]) > settings["steps"]:
        return None
    own = backbone.state_dict()
    model = state.get("model", {})
    if set(model) != set(own) or any(model[k].shape != own[k].shape for k in own):
        return None
    return {
        "seed": int(saved["seed"]),
        "forked_at": int(state["step"]),
        "forked_from": hashlib.sha256(data).hexdigest(),
    }


def fork_run_pretraining(
    state_path: Path,
    backbone: nn.Module,
    examples: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
    settings: dict[str, Any],
    on_step: Callable[[int, float], None] | None = None,
) -> nn.Module:
    """`backbone` = the run's classifier pre-training (`state_path`) continued to
    `settings["steps"]` steps, as one uninterrupted phase of that many steps would have
    trained it (`pretrain_classifier` resuming a copy of the state; the run's own file is
    not changed, nor this process's RNG); in eval mode.

    Args:
        state_path: the run's `pretrain.pt`.
        backbone: a network of the run's architecture (its weights are replaced).
        examples: the labelled examples of the meta-train classes.
        settings: the baseline's settings with `fork_settings`' (`steps`, `lr`,
            `batch_size`, `seed`, `num_classes`, `embedding_size`).
        on_step: progress, as in `pretrain_embedding`.
    """
    with tempfile.TemporaryDirectory(prefix="metadist-fork-") as directory:
        copy = Path(directory) / PRETRAIN_STATE
        shutil.copyfile(state_path, copy)
        with torch.random.fork_rng(devices=[]):
            pretrain_classifier(
                backbone,
                examples,
                num_classes=settings["num_classes"],
                embedding_size=settings["embedding_size"],
                steps=settings["steps"],
                lr=settings["lr"],
                batch_size=settings["batch_size"],
                seed=settings["seed"],
                state_path=copy,
                name="pretrained-embedding baseline",
                save_every=max(1, int(settings["steps"]) // 100),
                on_save=on_step,
            )
    return backbone.eval()
