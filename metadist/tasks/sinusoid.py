"""Sinusoid regression tasks of Finn et al. (2017), with no store."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from metadist.batch import MetaBatch, TaskSet
from metadist.options import Configurable
from metadist.tasks.base import TaskSampler, task_uniform
from metadist.tasks.registry import register_task_sampler


@register_task_sampler("sinusoid")
class SinusoidSampler(TaskSampler, Configurable):
    """y = A sin(x - phase), A ~ U[0.1, 5], phase ~ U[0, pi], x ~ U[-5, 5].

    Args:
        options: the sampler's `SinusoidSampler.Options` (below), or give its fields as
            keywords (`SinusoidSampler(num_support=5)`); kept as `self.options`.
        **keywords: the options' fields, instead of `options`.

    Shapes: `support.x [B, K, 1]`, `support.y [B, K, 1]`, likewise for the query.
    """

    @dataclass(frozen=True)
    class Options:
        """The sinusoid sampler's options (`sampler.options`).

        Attributes:
            num_support: K points per task to adapt on.
            num_query: Q points per task to score on.
            num_tasks: units per epoch (each unit is just a task number).
            query_grid: if true, the query is `num_query` evenly spaced points on the
                x range (the evaluation protocol of the paper) instead of random points.
            amplitude_range, phase_range, x_range: the uniform ranges A, phase and x are
                drawn from.
        """

        num_support: int = 10
        num_query: int = 10
        num_tasks: int = 10_000
        query_grid: bool = False
        amplitude_range: tuple[float, float] = (0.1, 5.0)
        phase_range: tuple[float, float] = (0.0, float(np.pi))
        x_range: tuple[float, float] = (-5.0, 5.0)

        def validate(self) -> None:
            """`ValueError` naming the first count below 1 or range not finite."""
            for field, value in (
                ("num_support", self.num_support),
                ("num_query", self.num_query),
                ("num_tasks", self.num_tasks),
            ):
                if int(value) < 1:
                    raise ValueError(f"sinusoid sampler: {field} must be >= 1, got {value}")
            for field, bounds in (
                ("amplitude_range", self.amplitude_range),
                ("phase_range", self.phase_range),
                ("x_range", self.x_range),
            ):
                if not all(math.isfinite(bound) for bound in bounds):
                    raise ValueError(
                        f"sinusoid sampler: {field} must be two finite numbers, got "
                        f"{list(bounds)} (every task would be NaN or inf)"
                    )

    needs_store = False

    def __init__(self, *, options: Options | None = None, **keywords: Any) -> None:
        self.options: SinusoidSampler.Options = self.read_options(keywords, options)
        opts = self.options
        self.num_support = int(opts.num_support)
        self.num_query = int(opts.num_query)
        self.num_tasks = int(opts.num_tasks)
        self.query_grid = bool(opts.query_grid)
        self.amplitude_range = _pair(opts.amplitude_range)
        self.phase_range = _pair(opts.phase_range)
        self.x_range = _pair(opts.x_range)

    @property
    def num_units(self) -> int:
        return self.num_tasks

    def sample(self, units: np.ndarray, seeds: np.ndarray) -> MetaBatch:
        num_tasks = len(units)
        k, q = self.num_support, self.num_query
        u = task_uniform(seeds, 2 + k + q)
        amplitude = _scale(u[:, 0:1], self.amplitude_range)
        phase = _scale(u[:, 1:2], self.phase_range)
        x = _scale(u[:, 2:], self.x_range)
        if self.query_grid:
            grid = np.linspace(self.x_range[0], self.x_range[1], q)
            x[:, k:] = grid[None, :]
        y = amplitude * np.sin(x - phase)
        x32 = torch.from_numpy(x.astype(np.float32)[..., None])
        y32 = torch.from_numpy(y.astype(np.float32)[..., None])
        return MetaBatch(
            support=TaskSet(x32[:, :k].contiguous(), y32[:, :k].contiguous()),
            query=TaskSet(x32[:, k:].contiguous(), y32[:, k:].contiguous()),
            entity_index=torch.full((num_tasks,), -1, dtype=torch.int64),
            stratum=torch.zeros(num_tasks, dtype=torch.int64),
            split_time=torch.full((num_tasks,), -1, dtype=torch.int64),
        )


def _scale(u: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    low, high = bounds
    return low + (high - low) * u


def _pair(values: tuple[float, float]) -> tuple[float, float]:
    low, high = values
    return float(low), float(high)
