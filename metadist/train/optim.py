"""The meta-optimizer: its registry, the built-in optimizers and the learning-rate schedule.

The run's `optimizer.*` section is `OptimizerConfig`, kept here beside the optimizers it
names (`metadist.train.config` imports it for `TrainConfig` and re-exports it). An
optimizer is registered as a function `(parameters, config) -> torch.optim.Optimizer`,
where `config` is that typed `OptimizerConfig`:

    @register_optimizer("lion")
    def lion(parameters, config):
        return Lion(parameters, lr=config.lr, weight_decay=config.weight_decay)

and selected with `optimizer.name=lion` (its module named in `imports`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from metadist.options import check_choice
from metadist.registry import Registry

_SCHEDULES = ("constant", "cosine")


@dataclass
class OptimizerConfig:
    """The outer-loop (meta) optimizer.

    Attributes:
        name: a registered optimizer (`metadist.train.optim`): `adam`, `adamw`, `sgd`.
        lr: learning rate, > 0.
        weight_decay: ≥ 0.
        betas: Adam(W) coefficients, each in [0, 1).
        momentum: SGD momentum, in [0, 1).
        grad_clip: clip the meta-gradient's global norm to this value; `None` for no clip.
        schedule: the learning rate over the run: `constant`, or `cosine` (from `lr` down
            to 0 at `trainer.meta_steps`, half a cosine wave).
        warmup_steps: meta-steps over which the learning rate first rises linearly to
            `lr` (then the schedule runs over the remaining steps).
    """

    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.0
    grad_clip: float | None = None
    schedule: str = "constant"
    warmup_steps: int = 0

    def validate(self) -> None:
        OPTIMIZERS.get(self.name)  # unknown: names the closest registered one
        check_choice("optimizer.schedule", self.schedule, _SCHEDULES)
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int):
            raise ValueError(
                f"optimizer.warmup_steps must be an integer, got {self.warmup_steps!r}"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"optimizer.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not self.lr > 0:
            raise ValueError(f"optimizer.lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"optimizer.weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optimizer.betas must be two values in [0, 1), got {self.betas}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"optimizer.momentum must be in [0, 1), got {self.momentum}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"optimizer.grad_clip must be > 0 or null, got {self.grad_clip}")


OptimizerFactory = Callable[[list, OptimizerConfig], torch.optim.Optimizer]
OPTIMIZERS: Registry[OptimizerFactory] = Registry("optimizer")


def register_optimizer(name: str) -> Callable[[OptimizerFactory], OptimizerFactory]:
    """Decorator registering an optimizer factory `(parameters, config) -> Optimizer`."""
    return OPTIMIZERS.register(name)


def scheduled_lr(config: OptimizerConfig, step: int, meta_steps: int) -> float:
    """The learning rate of meta-step `step + 1` (`step` steps done) under `config`.

    A function of the step alone, so a resumed run continues the schedule exactly.
    """
    warmup = config.warmup_steps
    if step < warmup:
        return config.lr * (step + 1) / warmup
    if config.schedule == "constant":
        return config.lr
    progress = (step - warmup) / max(1, meta_steps - warmup)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(config: OptimizerConfig, parameters) -> torch.optim.Optimizer:
    """The meta-optimizer named by `optimizer.name`, over the trainable `parameters`."""
    parameters = [p for p in parameters if p.requires_grad]
    return OPTIMIZERS.get(config.name)(parameters, config)


@register_optimizer("adam")
def _adam(parameters: list, config: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(
        parameters,
        lr=config.lr,
        betas=_betas(config),
        weight_decay=config.weight_decay,
        fused=_fusable(parameters),
    )


@register_optimizer("adamw")
def _adamw(parameters: list, config: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        parameters,
        lr=config.lr,
        betas=_betas(config),
        weight_decay=config.weight_decay,
        fused=_fusable(parameters),
    )


def _fusable(parameters: list) -> bool | None:
    """Whether Adam(W) can take its fused kernel (one per step, not one per tensor).

    The fused kernel runs on CPU and CUDA tensors of floating dtypes; it cut the Adam
    part of the sinusoid meta-step by about a fifth (BENCHMARKS.md, "Batched learners").
    `None` leaves the choice to torch (the `foreach` path) for anything else.
    """
    fusable = bool(parameters) and all(
        p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in parameters
    )
    return True if fusable else None


@register_optimizer("sgd")
def _sgd(parameters: list, config: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )


def _betas(config: OptimizerConfig) -> tuple[float, float]:
    first, second = config.betas  # validated: two values
    return float(first), float(second)
