"""The meta-optimizer: its registry, the built-in optimizers and the learning-rate schedule.

An optimizer is registered as a function `(parameters, config) -> torch.optim.Optimizer`,
where `config` is the run's typed `OptimizerConfig` (`optimizer.*`):

    @register_optimizer("lion")
    def lion(parameters, config):
        return Lion(parameters, lr=config.lr, weight_decay=config.weight_decay)

and selected with `optimizer.name=lion` (its module named in `imports`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from metadist.registry import Registry
from metadist.train.config import OptimizerConfig

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
        parameters, lr=config.lr, betas=_betas(config), weight_decay=config.weight_decay
    )


@register_optimizer("adamw")
def _adamw(parameters: list, config: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        parameters, lr=config.lr, betas=_betas(config), weight_decay=config.weight_decay
    )


@register_optimizer("sgd")
def _sgd(parameters: list, config: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )


def _betas(config: OptimizerConfig) -> tuple[float, float]:
    first, second = config.betas  # validated: two values
    return float(first), float(second)
