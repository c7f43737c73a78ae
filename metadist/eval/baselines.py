"""Baselines scored next to the adapted model, on the same tasks.

- `naive_forecast`: the last observed value, repeated over the horizon.
- `seasonal_naive_forecast`: the value one season earlier, repeated season by season.
- the meta-trained model without adaptation: the learner's parameters before the inner
  loop (`evaluate.py` gets them from `learner.adapt(support, steps=0)`);
- `fit_from_scratch`: the same network, freshly initialised by the caller, trained on each task's
  support set only (no meta-learning), with Adam. All tasks of a batch are trained at
  once: the parameters are stacked along a task dimension and the losses summed, so
  each task's parameters get exactly its own gradient, and Adam's update is elementwise.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from metadist.learners import LOSSES, task_losses


def naive_forecast(history, horizon: int) -> np.ndarray:
    """Repeats the last value of `history` (`[n]` or `[n, T]`) `horizon` times.

    Returns:
        `[horizon]` or `[horizon, T]` float64.

    Raises:
        ValueError: an empty history or horizon < 1.
    """
    history = _history(history, horizon)
    return np.repeat(history[-1:], horizon, axis=0)


def seasonal_naive_forecast(history, horizon: int, seasonal_period: int) -> np.ndarray:
    """ŷ_{n+h} = x_{n+h−m·k}, k the smallest integer putting the index inside the history.

    With m = 1 (or a history shorter than one season) this is the naive forecast.

    Returns:
        `[horizon]` or `[horizon, T]` float64.

    Raises:
        ValueError: an empty history, horizon < 1 or seasonal_period < 1.
    """
    history = _history(history, horizon)
    m = int(seasonal_period)
    if m < 1:
        raise ValueError(f"seasonal_period must be >= 1, got {seasonal_period}")
    if history.shape[0] < m:
        m = 1
    last_season = history[history.shape[0] - m :]
    return last_season[np.arange(horizon) % m]


def _history(history, horizon: int) -> np.ndarray:
    history = np.asarray(history, dtype=np.float64)
    if history.ndim == 0 or history.shape[0] == 0:
        raise ValueError("a naive forecast needs at least one value of history")
    if int(horizon) < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    return history


def fit_from_scratch(
    model: nn.Module,
    support_x: Tensor,
    support_y: Tensor,
    *,
    steps: int,
    lr: float,
    loss: str = "mse",
) -> dict[str, Tensor]:
    """Trains `model`'s initial weights on each task's support set only, one copy per task.

    Args:
        model: a freshly initialised network of the evaluated architecture (built from the
            run's model config, never the meta-trained one); it is not modified.
        support_x: `[B, K, ...]` support inputs of B tasks.
        support_y: `[B, K, ...]` support targets (`[B, K]` int64 for classification).
        steps: full-batch Adam steps per task.
        lr: Adam learning rate.
        loss: the training loss, one of `metadist.learners.LOSSES` (the evaluated
            learner's own, so the baseline optimises what the meta-trained model did).

    Returns:
        Parameters stacked over tasks: `{name: [B, *shape]}`; see `predict_stacked`.

    Raises:
        ValueError: steps < 0, lr <= 0, an unknown loss or mismatched task dimensions.
    """
    if int(steps) < 0:
        raise ValueError(f"from-scratch baseline: steps must be >= 0, got {steps}")
    if not lr > 0:
        raise ValueError(f"from-scratch baseline: lr must be > 0, got {lr}")
    if loss not in LOSSES:
        raise ValueError(f"from-scratch baseline: loss must be one of {LOSSES}, got {loss!r}")
    if support_x.shape[0] != support_y.shape[0]:
        raise ValueError(
            f"support_x and support_y disagree on the number of tasks: "
            f"{support_x.shape[0]} vs {support_y.shape[0]}"
        )
    num_tasks = support_x.shape[0]
    params = {
        name: p.detach().unsqueeze(0).repeat(num_tasks, *([1] * p.dim())).requires_grad_(True)
        for name, p in model.named_parameters()
    }
    buffers = dict(model.named_buffers())
    optimizer = torch.optim.Adam(list(params.values()), lr=lr, foreach=True)
    forward = _batched_forward(model, buffers)
    # Deterministic forward passes (dropout off), like the learners' evaluation path.
    model.eval()
    for _ in range(int(steps)):
        optimizer.zero_grad(set_to_none=True)
        outputs = forward(params, support_x)
        targets = support_y if loss == "cross_entropy" else support_y.reshape(outputs.shape)
        task_losses(loss, outputs, targets).sum().backward()
        optimizer.step()
    return {name: p.detach() for name, p in params.items()}


def predict_stacked(model: nn.Module, params: dict[str, Tensor], x: Tensor) -> Tensor:
    """Runs `model` with per-task parameters `{name: [B, ...]}` on inputs `[B, Q, ...]`."""
    with torch.no_grad():
        return _batched_forward(model, dict(model.named_buffers()))(params, x)


def _batched_forward(model: nn.Module, buffers: dict[str, Tensor]):
    """`f(params [B, ...], x [B, Q, ...]) -> [B, Q, ...]`, vmapped, or looped if vmap fails."""

    def one_task(task_params, task_x):
        return functional_call(model, (task_params, buffers), (task_x,))

    batched = vmap(one_task)
    state = {"loop": False}

    def forward(params, x):
        if not state["loop"]:
            try:
                return batched(params, x)
            except (RuntimeError, NotImplementedError) as error:
                state["loop"] = True
                print(
                    f"metadist.eval: {type(model).__name__} does not batch under vmap "
                    f"({str(error).splitlines()[0][:120]}); training per task in a loop",
                    file=sys.stderr,
                )
        outputs = [one_task({k: v[b] for k, v in params.items()}, x[b]) for b in range(x.shape[0])]
        return torch.stack(outputs)

    return forward
