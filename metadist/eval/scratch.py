"""The from-scratch baseline's training: one fresh network per task, all tasks at once.

`fit_from_scratch` trains copies of a freshly initialised network, one per task, on each
task's support set only (no meta-learning), with full-batch Adam. The parameters are
stacked along a task dimension `[B, ...]` and the model runs on every task at once, the way
the learners' inner loops do (`metadist.learners.inner_loop`): through the model's own
`batched_forward` where it has one (batched matmuls), else `vmap` of `functional_call`
(a per-task loop for a model that does not batch under vmap). The tasks' losses are
summed, so each task's parameters get exactly its own gradient, and Adam's update is
elementwise: every task is trained as it would be alone, to floating-point rounding.

The gradients: a model that writes out its own backward (`batched_vjp`: the MLP, the
forecaster) and a loss with a closed-form gradient give them without autograd
(`metadist.learners.explicit_grad`: same mathematics, no graph, and each weight's
gradient comes out in the weight's own layout); any other model through
`torch.autograd.grad`. There a gradient often comes out transposed (a batched linear
layer multiplies by `W^T`, so autograd's gradient of `W` is the transpose of a dense
`[B, D_in, D_out]`), and the fused Adam kernel needs dense operands: rather than copy it
every step, each such parameter is kept, from the first step on, in the layout its
gradient has (a permuted copy, the model reading its permuted-back view): the same
values and updates, no copy. Adam is `metadist.train.adam.Adam` (torch's fused kernel
where the device has one, else `foreach`), without a `torch.optim` object per batch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

from metadist.learners import LOSSES, task_losses
from metadist.learners.batching import has_batched_forward, has_batched_vjp
from metadist.learners.explicit_grad import PREDICTION_GRADS
from metadist.train.adam import Adam, has_fused_adam

Params = dict[str, Tensor]
# (the trained tensors and their views) -> the gradients of the leaves, in order
Gradients = Callable[["_Layout"], tuple[Tensor, ...]]


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
    model.eval()
    explicit = _explicit_gradients(model, loss, support_x, support_y)
    leaves = {
        name: p.detach().unsqueeze(0).repeat(num_tasks, *([1] * p.dim()))
        for name, p in model.named_parameters()
    }
    layout = _Layout(leaves, trainable=explicit is None)
    gradients = explicit or _autograd_gradients(batched_forward(model), loss, support_x, support_y)
    optimizer = None
    for step in range(int(steps)):
        grads = list(gradients(layout))
        if optimizer is None:  # the first step: the layout the gradients come in
            grads = layout.adopt(grads)
            fused = all(has_fused_adam(p.device, p.dtype) for p in layout.leaves.values())
            optimizer = Adam(layout.leaves.values(), lr, fused=fused, foreach=not fused)
        # contiguous: a no-op for a gradient in its parameter's layout; the fused CPU
        # kernel reads any operand as if it were dense
        optimizer.step([g.contiguous() for g in grads])
        if on_step is not None:
            on_step(step + 1)
    return {name: p.detach().contiguous() for name, p in layout.views().items()}


def _explicit_gradients(
    model: nn.Module, loss: str, support_x: Tensor, support_y: Tensor
) -> Gradients | None:
    """The gradients of the summed task losses from the model's written-out backward
    (`MLP.batched_vjp`, `WindowForecaster.batched_vjp`, as `learners.explicit_grad` takes
    them, without the losses' values, which training does not read), or None where the
    model or the loss has none."""
    output_shape = getattr(model, "output_shape", None)
    if loss not in PREDICTION_GRADS or output_shape is None or not has_batched_vjp(model):
        return None
    targets = support_y
    if loss != "cross_entropy":
        targets = support_y.reshape(*support_x.shape[:2], *output_shape)
    vjp: Any = model.batched_vjp  # checked: has_batched_vjp
    with torch.no_grad():  # a model whose batched_vjp declines (active dropout): autograd
        probe = vjp(dict(model.named_parameters()), support_x[:1])
        if probe is None:
            return None
        task_losses(loss, probe[0], targets[:1])  # predictions that fit the targets, once
    prediction_grad = _prediction_grad(loss, targets, probe[0])

    def gradients(layout: _Layout) -> tuple[Tensor, ...]:
        params = layout.views()
        with torch.no_grad():
            prediction, backward = vjp(params, support_x)
            grads = backward(prediction_grad(prediction), list(params))
        return tuple(grads[name] for name in params)

    return gradients


def _prediction_grad(loss: str, targets: Tensor, probe: Tensor) -> Callable[[Tensor], Tensor]:
    """`prediction [B, ...] -> d task_losses(loss, prediction, targets).sum() / d prediction`
    (`explicit_grad.PREDICTION_GRADS`); for cross-entropy with the one-hot targets made
    once, and the softmax over a few classes written out (`torch.softmax` over a last dim
    of 5 reads it a quarter as fast)."""
    if loss != "cross_entropy":
        return lambda prediction: PREDICTION_GRADS[loss](prediction, targets)
    one_hot = F.one_hot(targets, probe.shape[-1]).to(probe.dtype)
    inverse_count = 1.0 / targets[0].numel()

    def gradient(prediction: Tensor) -> Tensor:
        exp = (prediction - prediction.amax(-1, keepdim=True)).exp_()
        return exp.div_(exp.sum(-1, keepdim=True)).sub_(one_hot).mul_(inverse_count)

    return gradient


def _autograd_gradients(
    forward: Callable[[Params, Tensor], Tensor], loss: str, support_x: Tensor, support_y: Tensor
) -> Gradients:
    """The gradients of the summed task losses by `torch.autograd.grad`."""

    def gradients(layout: _Layout) -> tuple[Tensor, ...]:
        outputs = forward(layout.views(), support_x)
        targets = support_y if loss == "cross_entropy" else support_y.reshape(outputs.shape)
        total = task_losses(loss, outputs, targets).sum()
        return torch.autograd.grad(total, list(layout.leaves.values()))

    return gradients


class _Layout:
    """The trained tensors (`leaves`) and the views the model reads (`views()`, each a
    leaf permuted back to the parameter's shape): `adopt` moves a parameter whose first
    gradient is a permutation of a dense tensor into that permuted layout."""

    def __init__(self, leaves: Params, trainable: bool) -> None:
        self.trainable = trainable
        self.leaves = {k: v.requires_grad_(trainable) for k, v in leaves.items()}
        self.orders: dict[str, list[int]] = {}  # name -> the leaf's dims in view order

    def views(self) -> Params:
        return {
            name: leaf.permute(self.orders[name]) if name in self.orders else leaf
            for name, leaf in self.leaves.items()
        }

    def adopt(self, grads: list[Tensor]) -> list[Tensor]:
        """The first step's gradients, in the layout of the leaves from now on."""
        adopted = []
        for (name, leaf), grad in zip(list(self.leaves.items()), grads, strict=True):
            order = _dense_order(grad)
            if order is None or not self.trainable:
                adopted.append(grad)
                continue
            self.leaves[name] = leaf.detach().permute(order).contiguous().requires_grad_(True)
            self.orders[name] = sorted(range(len(order)), key=order.__getitem__)
            adopted.append(grad.permute(order))
        return adopted


def _dense_order(grad: Tensor) -> list[int] | None:
    """The dims of `grad` from outermost to innermost in memory, where `grad` is a
    permutation of a dense tensor other than itself (else None)."""
    if grad.is_contiguous() or grad.dim() < 2:
        return None
    order = sorted(range(grad.dim()), key=lambda d: (-int(grad.stride()[d]), d))
    permuted = grad.permute(order)
    return order if permuted.is_contiguous() else None


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
