"""The memory a run needs, estimated from its config before anything is allocated.

A model is first built on PyTorch's `meta` device, which records shapes and allocates
nothing, so `model.options.hidden_sizes=[100000,100000]` is refused in one line instead
of taking the machine's memory. The estimate is a lower bound: parameters, their
gradients and the optimiser's state, plus one copy of the parameters per task and inner
step that the meta-gradient keeps (second order) or that the inner loop holds at once.
Activations come on top, so a run refused here could never have fitted.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

BYTES_PER_VALUE = 4  # float32 parameters and states


@dataclass(frozen=True)
class MemoryEstimate:
    """A lower bound of a rank's memory for one meta-step, in bytes, and its parts."""

    num_parameters: int
    state_bytes: int  # parameters, gradients, optimiser state
    inner_loop_bytes: int  # adapted copies held for the meta-gradient

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.inner_loop_bytes


def count_parameters(build: Callable[[], nn.Module]) -> int:
    """The number of parameters of the model `build()` returns, built without memory."""
    with torch.device("meta"):
        model = build()
    return sum(p.numel() for p in model.parameters())


def estimate_memory(
    num_parameters: int,
    tasks_per_rank: int,
    inner_steps: int,
    first_order: bool,
    optimizer_states: int = 2,
) -> MemoryEstimate:
    """The lower bound of one rank's memory for a meta-step.

    Args:
        num_parameters: the model's parameters.
        tasks_per_rank: tasks in a rank's share of the meta-batch (they adapt at once).
        inner_steps: gradient steps of the inner loop (0 for learners without one).
        first_order: whether only the last adapted copy per task is kept.
        optimizer_states: values the meta-optimiser keeps per parameter (Adam: 2).
    """
    values = num_parameters * BYTES_PER_VALUE
    copies = 0 if inner_steps == 0 else (1 if first_order else inner_steps)
    return MemoryEstimate(
        num_parameters=num_parameters,
        state_bytes=values * (2 + optimizer_states),
        inner_loop_bytes=values * copies * 2 * tasks_per_rank,  # copy and its gradient
    )


def available_memory() -> int | None:
    """Bytes the system can still give (`MemAvailable`), or None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(estimate: MemoryEstimate, available: int | None, fields: str) -> None:
    """Refuses a run whose lower bound exceeds the memory available.

    Raises:
        ValueError: one line with the estimate, what is available and the `fields`
            that decide it.
    """
    if available is None or estimate.total_bytes <= available:
        return
    raise ValueError(
        f"this run needs at least {_gb(estimate.total_bytes)} per process "
        f"({estimate.num_parameters:,} model parameters: {_gb(estimate.state_bytes)} for "
        f"them, their gradients and the optimiser, {_gb(estimate.inner_loop_bytes)} for the "
        f"inner loop) but {_gb(available)} is available; lower {fields}"
    )


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB" if num_bytes >= 2**27 else f"{num_bytes / 2**20:.0f} MiB"


def cpu_count() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
