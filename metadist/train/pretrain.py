"""Classifier pre-training: a model's embedding trained with a linear head, resumable.

The "classifier baseline" stage of Meta-Baseline (Chen et al., 2021) and the
pretrained-embedding baseline of the few-shot evaluation (Chen et al. 2019, Tian et al.
2020): the model (whose output is an embedding `[..., D]`) gets a linear head
`D → num_classes` over the meta-train classes, both are trained with cross-entropy and
Adam, and the head is then dropped (or kept, by the caller).

With a `state_path` the whole state — model, head, optimizer, the step reached and the
torch RNG (the model's dropout draws) — is written there (atomically) every
`save_every` steps and at the end; a later call with the same path continues from it and
ends exactly where one uninterrupted call would have (bitwise on CPU). The batch of step
t is `examples(batch_size, seed * 1_000_003 + t)`, a function of t alone, so the data
stream needs no state of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metadist.durable import atomic_file
from metadist.options import check_min, check_range
from metadist.train.adam import Adam

_FORMAT = "metadist.pretrain/1"
# The file of a run's pre-training state in its run directory (`train.pretrain_phase`;
# the evaluation's pretrained-embedding baseline continues it, `eval.pretrained_run`).
PRETRAIN_STATE = "pretrain.pt"
# What the saved state must agree on with a call resuming it (the model itself is checked
# by load_state_dict).
_SETTINGS = ("num_classes", "embedding_size", "lr", "batch_size", "seed")


@dataclass
class PretrainConfig:
    """Classifier pre-training before meta-training (`train.pretrain_phase`).

    Attributes:
        steps: Adam steps of the model (its embedding, with a linear head over the
            meta-train classes); 0 (default) skips the phase. Needs a sampler with
            labelled examples (`nway_kshot`).
        lr: Adam's learning rate.
        batch_size: labelled examples per step.
        save_every: steps between saves of the phase's state (`run_dir/pretrain.pt`),
            from which a killed run resumes the phase exactly.
    """

    steps: int = 0
    lr: float = 1e-3
    batch_size: int = 64
    save_every: int = 100

    def validate(self) -> None:
        check_range("pretrain.steps", self.steps, 0, 10**12)
        if not self.lr > 0:
            raise ValueError(f"pretrain.lr must be > 0, got {self.lr}")
        check_range("pretrain.batch_size", self.batch_size, 1, 1 << 20)
        check_min("pretrain.save_every", self.save_every, 1)


@dataclass
class Pretrained:
    """What `pretrain_classifier` returns (the model is trained in place).

    Attributes:
        head: the trained linear head `D → num_classes` (the model's dtype and device).
        step: steps trained in all (the `steps` asked for).
        resumed_from: the step the saved state held when this call started (0: fresh).
        losses: `[steps - resumed_from]` the cross-entropy of each step this call ran,
            detached.
    """

    head: nn.Linear
    step: int
    resumed_from: int
    losses: Tensor


def pretrain_classifier(
    model: nn.Module,
    examples: Callable[[int, int], tuple[Tensor, Tensor]],
    *,
    num_classes: int,
    embedding_size: int,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int = 0,
    state_path: str | os.PathLike | None = None,
    save_every: int = 0,
    name: str = "classifier pretraining",
    on_save: Callable[[int, float], None] | None = None,
) -> Pretrained:
    """Trains `model` with a linear head as a classifier of `num_classes` classes.

    Args:
        model: maps `x [N, ...]` to features `[N, embedding_size]`; trained in place (in
            train mode; its mode is restored at the end).
        examples: `examples(num, seed) -> (x [num, ...], class [num] int64 in
            [0, num_classes))`, e.g. `EvaluationTasks.labelled_examples`.
        num_classes: classes of the head (≥ 2).
        embedding_size: D, the model's output size.
        steps: total Adam steps (≥ 1), counting those a saved state already holds.
        lr: Adam's learning rate.
        batch_size: examples per step.
        seed: seeds the head's initialisation and the batches.
        state_path: a file to save the state to and resume from (see the module
            docstring); None trains in memory only.
        save_every: with `state_path`, also save every this many steps (0: at the end
            only).
        name: what error messages call this training.
        on_save: called with `(step, loss)` every `save_every` steps and at the end
            (progress of a long phase), whether or not a state is saved.

    Returns:
        `Pretrained` (head, steps, the step resumed from, the losses of this call).

    Raises:
        ValueError: steps < 1, fewer than 2 classes, save_every < 0, a model whose output
            is not `[N, embedding_size]`, or a saved state of other settings or of more
            steps than `steps`.
    """
    _check_counts(name, steps, num_classes, save_every)
    settings = {
        "num_classes": int(num_classes),
        "embedding_size": int(embedding_size),
        "lr": float(lr),
        "batch_size": int(batch_size),
        "seed": int(seed),
    }
    reference = next(model.parameters())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # Drawn on the CPU from the seed alone, whatever the model's device.
        head = nn.Linear(embedding_size, num_classes, dtype=reference.dtype)
    head = head.to(reference.device)
    # torch.optim.Adam's update without its object (whose first construction imports
    # torch._dynamo: seconds); its state_dict is torch.optim.Adam's
    optimizer = Adam([*model.parameters(), *head.parameters()], lr=lr)
    start = 0
    if state_path is not None and Path(state_path).exists():
        start = _load(Path(state_path), model, head, optimizer, settings, steps, name)
    was_training = model.training
    model.train()
    losses = []
    for step in range(start, steps):
        batch = examples(batch_size, seed * 1_000_003 + step)
        losses.append(_train_step(model, head, optimizer, batch, embedding_size, name))
        done = step + 1
        if state_path is not None and (done == steps or (save_every and done % save_every == 0)):
            _save(Path(state_path), model, head, optimizer, settings, done)
        if on_save is not None and (done == steps or (save_every and done % save_every == 0)):
            on_save(done, float(losses[-1]))
    model.train(was_training)
    history = torch.stack(losses) if losses else reference.new_zeros(0).detach()
    return Pretrained(head=head, step=steps, resumed_from=start, losses=history)


def _check_counts(name: str, steps: int, num_classes: int, save_every: int) -> None:
    if steps < 1:
        raise ValueError(f"{name}: steps must be >= 1, got {steps}")
    if num_classes < 2:
        raise ValueError(
            f"{name}: the meta-train split has {num_classes} class; it needs 2 or more"
        )
    if save_every < 0:
        raise ValueError(f"{name}: save_every must be >= 0, got {save_every}")


def _train_step(
    model: nn.Module,
    head: nn.Linear,
    optimizer: Adam,
    batch: tuple[Tensor, Tensor],
    embedding_size: int,
    name: str,
) -> Tensor:
    """One Adam step on the cross-entropy of `batch`; returns the loss, detached."""
    device = next(model.parameters()).device
    x, y = batch[0].to(device), batch[1].to(device)
    features = model(x)
    if features.shape[-1] != embedding_size or features.dim() != 2:
        raise ValueError(
            f"{name}: the model must map [N, ...] to [N, {embedding_size}], got "
            f"{tuple(features.shape)}"
        )
    loss = F.cross_entropy(head(features), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _save(
    path: Path,
    model: nn.Module,
    head: nn.Linear,
    optimizer: Adam,
    settings: dict[str, Any],
    step: int,
) -> None:
    state = {
        "format": _FORMAT,
        "step": step,
        "settings": settings,
        "model": model.state_dict(),
        "head": head.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": _rng_state(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as temporary:
        torch.save(state, temporary)


def _load(
    path: Path,
    model: nn.Module,
    head: nn.Linear,
    optimizer: Adam,
    settings: dict[str, Any],
    steps: int,
    name: str,
) -> int:
    """Restores the saved state into `model`, `head`, `optimizer` and the torch RNG;
    returns the step it holds."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{name}: {path} is not a readable pretraining state: {error}") from None
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise ValueError(f"{name}: {path} is not a pretraining state ({_FORMAT})")
    for key in _SETTINGS:
        if state["settings"].get(key) != settings[key]:
            raise ValueError(
                f"{name}: {path} was saved with {key}={state['settings'].get(key)!r}, this call "
                f"has {key}={settings[key]!r}; use another state file or the same settings"
            )
    step = int(state["step"])
    if step > steps:
        raise ValueError(
            f"{name}: {path} holds {step} steps, more than steps={steps}; raise steps to "
            "continue it, or use another state file"
        )
    model.load_state_dict(state["model"])
    head.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["cpu"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return step
