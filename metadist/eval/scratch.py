"""The from-scratch baseline's training: one fresh network per task, all tasks at once.

`fit_from_scratch` trains copies of a freshly initialised network, one per task, on each
task's support set only (no meta-learning), with full-batch Adam. The parameters are
stacked along a task dimension `[B, ...]` and the model runs on every task at once, the way
the learners' inner loops do (`metadist.learners.inner_loop`): through the model's own
`batched_forward` where it has one (batched matmuls), else `vmap` of `functional_call`
(a per-task loop for a model that does not batch under vmap). The tasks' losses are
summed, so each task's parameters get exactly its own gradient, and Adam's update is
elementwise: every task is trained as it would be alone, to floating-point rounding.

Adam is torch's functional `adam` (fused where the device has a fused kernel, else
`foreach`) on the stacked tensors: the same update as `torch.optim.Adam`, without an
optimizer object per batch (whose first construction imports `torch._dynamo`, seconds).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.optim.adam import adam

from metadist.learners import LOSSES, task_losses
from metadist.learners.batching import has_batched_forward

Params = dict[str, Tensor]
# Adam's constants, as `torch.optim.Adam`'s defaults.
_BETAS = (0.9, 0.999)
_EPS = 1e-8


def fit_from_scratch(
    model: nn.Module,
    support_x: Tensor,
    support_y: Tensor,
    *,
    steps: int,
    lr: float,
    loss: str = "mse",
    on_step: Callable[[int], None] | None = None,
) -> Params:
    """Trains `model`'s initial weights on each task's support set only, one copy per task.

    Args:
        model: a freshly initialised network of the evaluated architecture (built from the
            run's model config, never the meta-trained one); its weights are not modified
            (it is put in eval mode: deterministic forward passes, dropout off).
        support_x: `[B, K, ...]` support inputs of B tasks.
        support_y: `[B, K, ...]` support targets (`[B, K]` int64 for classification).
        steps: full-batch Adam steps per task.
        lr: Adam learning rate.
        loss: the training loss, one of `metadist.learners.LOSSES` (the evaluated
            learner's own, so the baseline optimises what the meta-trained model did).
        on_step: called with the number of steps done after each step (progress).

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
    model.eval()
    forward = batched_forward(model)
    optimizer = _Adam(list(params.values()), lr)
    for step in range(int(steps)):
        outputs = forward(params, support_x)
        targets = support_y if loss == "cross_entropy" else support_y.reshape(outputs.shape)
        total = task_losses(loss, outputs, targets).sum()
        optimizer.step(torch.autograd.grad(total, list(params.values())))
        if on_step is not None:
            on_step(step + 1)
    return {name: p.detach() for name, p in params.items()}


def predict_stacked(model: nn.Module, params: Params, x: Tensor) -> Tensor:
    """Runs `model` with per-task parameters `{name: [B, ...]}` on inputs `[B, Q, ...]`."""
    with torch.no_grad():
        return batched_forward(model)(params, x)


def batched_forward(model: nn.Module) -> Callable[[Params, Tensor], Tensor]:
    """`f(params [B, ...], x [B, Q, ...]) -> [B, Q, ...]`: the model's own
    `batched_forward` where it has one, else `vmap` of `functional_call` (or a loop over
    tasks if vmap fails)."""
    if has_batched_forward(model):
        native: Any = model.batched_forward  # checked: has_batched_forward
        return native
    buffers = dict(model.named_buffers())

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


class _Adam:
    """Adam's state for a list of tensors and its update (`torch.optim.adam.adam`): fused
    where the device has the kernel (torch >= 2.4 on CPU), else `foreach`."""

    def __init__(self, params: list[Tensor], lr: float) -> None:
        self.params = params
        self.lr = float(lr)
        self.exp_avgs = [torch.zeros_like(p) for p in params]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in params]
        self.fused = bool(params) and all(_has_fused_adam(p.device, p.dtype) for p in params)
        # as torch.optim.Adam keeps them: on the parameter's device when fused
        self.steps = [
            torch.zeros((), dtype=torch.float32, device=p.device if self.fused else "cpu")
            for p in params
        ]

    def step(self, grads: tuple[Tensor, ...]) -> None:
        # contiguous: the fused CPU kernel reads a strided gradient as if it were dense
        with torch.no_grad():
            _adam_update(
                self.params,
                [g.contiguous() for g in grads],
                self.exp_avgs,
                self.exp_avg_sqs,
                self.steps,
                self.lr,
                self.fused,
            )


def _adam_update(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    lr: float,
    fused: bool,
) -> None:
    adam(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        foreach=not fused,
        fused=fused,
        amsgrad=False,
        beta1=_BETAS[0],
        beta2=_BETAS[1],
        lr=lr,
        weight_decay=0.0,
        eps=_EPS,
        maximize=False,
    )


@functools.cache
def _has_fused_adam(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch has a fused Adam kernel for tensors of `device` and `dtype` (tried
    once on a one-element tensor)."""
    if not dtype.is_floating_point:
        return False
    probe = [torch.zeros(1, device=device, dtype=dtype)]
    state = [torch.zeros(1, device=device, dtype=dtype) for _ in range(3)]
    try:
        with torch.no_grad():
            step = [torch.zeros((), device=device)]
            _adam_update(probe, state[:1], state[1:2], state[2:], step, 1e-3, True)
    except (RuntimeError, NotImplementedError):
        return False
    return True
