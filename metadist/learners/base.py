"""The learner protocol, the learner registry and the shared functional inner loop.

A learner is an `nn.Module` that holds a plain model (`learner.model`) and turns a
`MetaBatch` into a meta-loss (`forward`, what training calls once per meta-step, so DDP
can wrap it) or into adapted parameters (`adapt` + `predict`, what evaluation calls).

Gradient-based learners share `InnerLoopLearner`: the model's parameters are a dict and
the model is called through `torch.func.functional_call`. The B tasks of a batch adapt
together: every adapted parameter is expanded to `[B, ...]`, the model runs on all tasks
at once (`vmap` of `functional_call`, or the model's own `batched_forward`), and each
inner step is one `torch.autograd.grad` of the sum of the per-task losses. Second-order
meta-gradients come from ordinary autograd through the updates and the expansion: the
inner gradients never touch `.grad`, so under DDP the only all-reduce is the outer
backward. Models that cannot run batched fall back to the same code one task at a time.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_map

from metadist.batch import MetaBatch, TaskSet

logger = logging.getLogger("metadist.learners")

LOSSES = ("mse", "mae", "smape", "cross_entropy")
# Element-wise regression losses (prediction and target of equal shape). "smape" is the
# M3/M4 symmetric absolute percentage error as a fraction (2|y - p| / (|y| + |p|), 0 where
# both are 0): scale-free, so series of any magnitude weigh alike; meant for raw
# (unscaled) positive values, as forecasting competitions score them.
REGRESSION_LOSSES = ("mse", "mae", "smape")
Params = dict[str, Tensor]

_REGISTRY: dict[str, type[Learner]] = {}
_WARNED_FALLBACK: set[tuple[str, str, str]] = set()


@dataclass
class MetaOutput:
    """What `Learner.forward` returns for one meta-step.

    Attributes:
        loss: scalar meta-loss averaged over the batch's tasks; backward it once.
        metrics: name → detached 0-dim tensor, e.g. `query_loss_before`,
            `query_loss_after` (averaged over tasks).
    """

    loss: Tensor
    metrics: dict[str, Tensor]


def register_learner(name: str):
    """Class decorator registering a `Learner` subclass under `name`.

    Example:
        >>> @register_learner("my_learner")
        ... class MyLearner(InnerLoopLearner): ...
    """

    def decorator(cls: type[Learner]) -> type[Learner]:
        if not (isinstance(cls, type) and issubclass(cls, Learner)):
            raise TypeError(f"@register_learner({name!r}) needs a Learner subclass")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(
                f"learner {name!r} is already registered by "
                f"{existing.__module__}.{existing.__qualname__}"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def registered_learners() -> list[str]:
    """Names of all registered learners, sorted."""
    return sorted(_REGISTRY)


def get_learner(name: str) -> type[Learner]:
    """The learner class registered as `name`; `ValueError` listing the known names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(registered_learners()) or "none"
        raise ValueError(f"unknown learner {name!r}; registered: {known}") from None


def build_learner(name: str, model: nn.Module, **options: Any) -> Learner:
    """Builds the learner registered as `name` around `model`.

    Raises:
        ValueError: unknown learner, an option the learner does not have, or a bad value.
    """
    cls = get_learner(name)
    accepted = [
        p.name
        for p in list(inspect.signature(cls.__init__).parameters.values())[2:]
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"learner {name!r} has no option {unknown[0]!r}; its options: {', '.join(accepted)}"
        )
    return cls(model, **options)


def _elementwise_loss(kind: str, prediction: Tensor, target: Tensor) -> Tensor:
    """Per-element regression loss of `kind` ("mse", "mae" or "smape")."""
    error = prediction - target
    if kind == "mse":
        return error.square()
    if kind == "mae":
        return error.abs()
    total = prediction.abs() + target.abs()
    # 0/0 (both zero) scores 0, and the denominator never reaches 0 in the backward pass.
    return torch.where(total > 0, 2 * error.abs() / total.clamp_min(1e-12), 0.0)


def task_loss(kind: str, prediction: Tensor, target: Tensor) -> Tensor:
    """Scalar loss of one task (or of any batch, averaged over all elements).

    Args:
        kind: "mse", "mae", "smape" (prediction and target of equal shape; see
            `REGRESSION_LOSSES`) or "cross_entropy" (prediction `[..., N]` logits, target
            `[...]` int64 class indices).

    Raises:
        ValueError: shapes that do not fit the loss.
    """
    if kind in REGRESSION_LOSSES:
        if prediction.shape != target.shape:
            raise ValueError(
                f"{kind} loss: model output {tuple(prediction.shape)} does not match targets "
                f"{tuple(target.shape)}; check the model's output_shape"
            )
        if kind == "mse":
            return F.mse_loss(prediction, target)
        return _elementwise_loss(kind, prediction, target).mean()
    if prediction.shape[:-1] != target.shape:
        raise ValueError(
            f"cross_entropy loss: model output {tuple(prediction.shape)} must be targets "
            f"{tuple(target.shape)} plus a class dimension"
        )
    return F.cross_entropy(prediction.reshape(-1, prediction.shape[-1]), target.reshape(-1))


def task_losses(kind: str, prediction: Tensor, target: Tensor) -> Tensor:
    """Per-task losses `[B]` of a batch of tasks: `task_loss` of each task's slice.

    Args:
        kind: one of `LOSSES` (see `task_loss`).
        prediction: `[B, ...]` model outputs; target: `[B, ...]` targets.

    Raises:
        ValueError: shapes that do not fit the loss (named per task, without B).
    """
    num_tasks = prediction.shape[0]
    if kind in REGRESSION_LOSSES:
        if prediction.shape != target.shape:
            raise ValueError(
                f"{kind} loss: model output {tuple(prediction.shape[1:])} does not match "
                f"targets {tuple(target.shape[1:])}; check the model's output_shape"
            )
        return _elementwise_loss(kind, prediction, target).reshape(num_tasks, -1).mean(1)
    if prediction.shape[:-1] != target.shape:
        raise ValueError(
            f"cross_entropy loss: model output {tuple(prediction.shape[1:])} must be targets "
            f"{tuple(target.shape[1:])} plus a class dimension"
        )
    losses = F.cross_entropy(
        prediction.reshape(-1, prediction.shape[-1]), target.reshape(-1), reduction="none"
    )
    return losses.reshape(num_tasks, -1).mean(1)


def _accuracy(prediction: Tensor, target: Tensor, batched: bool = False) -> Tensor:
    """Fraction of correct argmax predictions: per task `[B]` when batched, else scalar."""
    correct = (prediction.argmax(dim=-1) == target).to(prediction.dtype)
    return correct.reshape(correct.shape[0], -1).mean(1) if batched else correct.mean()


class Learner(nn.Module, ABC):
    """Base of every learner.

    Args:
        model: any `nn.Module` mapping `[..., *input_shape]` → `[..., *output_shape]`.
        loss: "mse", "mae" or "smape" (regression, forecasting; see `REGRESSION_LOSSES`)
            or "cross_entropy" (classification).
        vectorize: run the tasks of a batch together (batched inner loops); False
            forces a per-task Python loop.

    Raises:
        ValueError: a bad option, naming it.
    """

    name: ClassVar[str] = ""
    # False for learners with no inner loop (Prototypical Networks): their model without
    # adaptation means nothing, so evaluation scores no "unadapted" row for them.
    has_inner_loop: ClassVar[bool] = True

    def __init__(self, model: nn.Module, loss: str = "mse", vectorize: bool = True) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ValueError(
                f"learner {self.name!r}: model must be an nn.Module, got {type(model)}"
            )
        if loss not in LOSSES:
            raise ValueError(f"learner {self.name!r}: loss must be one of {LOSSES}, got {loss!r}")
        self.model = model
        self.loss = loss
        self.vectorize = _flag(self.name, "vectorize", vectorize)

    @abstractmethod
    def forward(self, batch: MetaBatch) -> MetaOutput:
        """Meta-loss and metrics of one meta-step over the B tasks of `batch`."""

    @abstractmethod
    def adapt(self, support: TaskSet, steps: int | None = None) -> Params:
        """Per-task adapted state from the support sets, a dict of `[B, ...]` tensors."""

    @abstractmethod
    def predict(self, params: Params, x: Tensor) -> Tensor:
        """Predictions `[B, ...]` for inputs `x [B, ...]` with the state from `adapt`."""

    def _options_error(self, field: str, requirement: str, value: Any) -> ValueError:
        return ValueError(f"learner {self.name!r}: {field} {requirement}, got {value!r}")


class InnerLoopLearner(Learner):
    """Shared machinery of the gradient-based learners (MAML, Meta-SGD, ANIL, Reptile).

    Args:
        model: the model (see `Learner`).
        inner_steps: gradient steps on the support set per task during training (≥ 0).
        inner_lr: step size of the inner loop (the initial value where it is learned).
        eval_inner_steps: steps `adapt` takes in eval mode (`learner.eval()`); defaults
            to `inner_steps`. `adapt(support, steps=N)` overrides both.
        first_order: drop the second-order terms (the inner gradients are treated as
            constants in the meta-gradient).
        loss: one of `LOSSES`.
        vectorize: run the tasks batched (default). Models that cannot run batched
            (recurrent layers, batch norm updating running statistics) fall back to a
            per-task loop automatically, with one logged warning; False forces the loop.
        check_finite: raise when a support or query loss is NaN/inf (costs one host sync
            per call).
        unadapted_metrics: also score the unadapted model on each query set for the
            `query_loss_before` metric (one extra no-grad forward per task).

    How the tasks run together: each adapted parameter is expanded to `[B, ...]`, the
    model runs on all tasks at once (its `batched_forward(params, x)` if it has one —
    every parameter `[B, ...]`, `x [B, N, ...]` → `[B, N, ...]` — else `vmap` of
    `functional_call`), and each inner step is one plain `torch.autograd.grad` of the sum
    of the task losses, which for independent tasks is every task's own gradient. No
    transform is nested around a gradient, so second-order meta-gradients need no vmap
    rule for a double backward and are exact through fused kernels such as
    `nn.LayerNorm` and batch norm without running statistics (tested against finite
    differences).

    Models with batch norm: in train mode every forward of the inner loop and of the query
    set (also the unadapted one behind `query_loss_before`) updates the running
    statistics, so they run in the per-task loop; in eval mode they use the running
    statistics and run batched. Models with dropout draw independent masks per task when
    batched (`randomness="different"`), so the two paths agree only in distribution.

    Raises:
        ValueError: a bad option, naming it.
    """

    def __init__(
        self,
        model: nn.Module,
        inner_steps: int = 1,
        inner_lr: float = 0.01,
        eval_inner_steps: int | None = None,
        first_order: bool = False,
        loss: str = "mse",
        vectorize: bool = True,
        check_finite: bool = True,
        unadapted_metrics: bool = True,
    ) -> None:
        super().__init__(model, loss=loss, vectorize=vectorize)
        self.inner_steps = self._steps("inner_steps", inner_steps)
        self.eval_inner_steps = (
            self.inner_steps
            if eval_inner_steps is None
            else self._steps("eval_inner_steps", eval_inner_steps)
        )
        if not isinstance(inner_lr, (int, float)) or isinstance(inner_lr, bool) or inner_lr <= 0:
            raise self._options_error("inner_lr", "must be a number > 0", inner_lr)
        self.inner_lr = float(inner_lr)
        self.first_order = _flag(self.name, "first_order", first_order)
        self.check_finite = _flag(self.name, "check_finite", check_finite)
        self.unadapted_metrics = _flag(self.name, "unadapted_metrics", unadapted_metrics)
        self._vmap_failed = False
        self._native_batching = has_batched_forward(model)
        # functional_call's search for tied tensors walks every module on every call;
        # skip it for models without any (most).
        self._tie_weights = _has_tied_tensors(model)
        self._usage_checked = False

    # ----------------------------------------------------------------- hooks
    def adapted_names(self, params: Params | None = None) -> list[str]:
        """Names of the parameters the inner loop updates (all trainable ones here).

        Args:
            params: the model's `named_parameters()` as a dict, if the caller has it.
        """
        if params is None:
            params = dict(self.model.named_parameters())
        return [n for n, p in params.items() if p.requires_grad]

    def step_size(self, step: int, name: str) -> Tensor | float:
        """Step size of parameter `name` at inner step `step` (fixed `inner_lr` here)."""
        return self.inner_lr

    # -------------------------------------------------------------- protocol
    def forward(self, batch: MetaBatch) -> MetaOutput:
        """Adapts every task on its support set and scores it on its query set.

        Returns:
            `MetaOutput` whose loss is the mean post-adaptation query loss; metrics
            `query_loss_after`, `query_loss_before` (with `unadapted_metrics`),
            `support_loss_before` (with ≥ 1 inner step) and, for cross-entropy,
            `query_accuracy_after` / `query_accuracy_before`.

        Raises:
            RuntimeError: a parameter gets no gradient, or a loss is NaN/inf.
        """
        params, buffers = self._state()
        self._check_usage(params, buffers, batch.support)
        names = self.adapted_names(params)
        steps = self.inner_steps
        out = self._dispatch(
            lambda batched, *task: self._score(params, buffers, names, steps, batched, *task),
            batch.support.x,
            batch.support.y,
            batch.query.x,
            batch.query.y,
        )
        self._raise_if_not_finite(out["support"], out["after"])
        return MetaOutput(out["after"].mean(), self._metrics(out))

    def adapt(self, support: TaskSet, steps: int | None = None) -> Params:
        """Adapts the model to each task's support set.

        Args:
            support: `x [B, K, ...]`, `y [B, K, ...]`.
            steps: inner steps; default `inner_steps` in train mode, `eval_inner_steps`
                in eval mode. Builds a graph to the meta-parameters only when grad mode
                is on (wrap in `torch.no_grad()` for evaluation).

        Returns:
            Every model parameter as a `[B, ...]` tensor (unadapted ones expanded).

        Raises:
            ValueError: negative `steps`. RuntimeError: as in `forward`.
        """
        if steps is None:
            steps = self.inner_steps if self.training else self.eval_inner_steps
        steps = self._steps("steps", steps)
        params, buffers = self._state()
        self._check_usage(params, buffers, support)
        names = self.adapted_names(params)

        def adapt_tasks(batched: bool, x: Tensor, y: Tensor) -> tuple[Params, Tensor]:
            fast, support_losses = self._inner_loop(params, buffers, names, steps, batched, x, y)
            shape = (x.shape[0],) if batched else ()
            full = {
                n: fast[n] if n in fast else p.expand(*shape, *p.shape) for n, p in params.items()
            }
            return full, support_losses

        fast, support_losses = self._dispatch(adapt_tasks, support.x, support.y)
        self._raise_if_not_finite(support_losses, None)
        return fast

    def predict(self, params: Params, x: Tensor) -> Tensor:
        """`[B, Q, *output_shape]` predictions for `x [B, Q, *input_shape]`."""
        _, buffers = self._state()
        return self._dispatch(
            lambda batched, p, xs: self._run_model(p, {}, buffers, xs, batched), params, x
        )

    # -------------------------------------------------------------- internals
    def _state(self) -> tuple[Params, Params]:
        return dict(self.model.named_parameters()), dict(self.model.named_buffers())

    def _score(
        self,
        params: Params,
        buffers: Params,
        names: list[str],
        steps: int,
        batched: bool,
        support_x: Tensor,
        support_y: Tensor,
        query_x: Tensor,
        query_y: Tensor,
        keep_fast: bool = False,
    ) -> dict[str, Any]:
        """Adapts the tasks and scores them on their query sets.

        With `batched`, every tensor has a leading task dim B and the outputs are per
        task (`after [B]`, `support [B, steps]`, ...); without, it is one task's.
        `keep_fast` adds the adapted parameters under "fast".
        """
        fast, support_losses = self._inner_loop(
            params, buffers, names, steps, batched, support_x, support_y
        )
        fixed = {n: p for n, p in params.items() if n not in fast}
        prediction = self._run_model(fast, fixed, buffers, query_x, batched)
        out: dict[str, Any] = {
            "after": self._losses(prediction, query_y, batched),
            "support": support_losses,
        }
        if keep_fast:
            out["fast"] = fast
        classify = self.loss == "cross_entropy"
        if classify:
            out["accuracy_after"] = _accuracy(prediction.detach(), query_y, batched)
        if self.unadapted_metrics:
            with torch.no_grad():
                before = self._unadapted(query_x, batched)
                out["before"] = self._losses(before, query_y, batched)
                if classify:
                    out["accuracy_before"] = _accuracy(before, query_y, batched)
        return out

    def _inner_loop(
        self,
        params: Params,
        buffers: Params,
        names: list[str],
        steps: int,
        batched: bool,
        x: Tensor,
        y: Tensor,
    ) -> tuple[Params, Tensor]:
        """`steps` gradient steps on the support set `(x, y)`.

        Batched, each adapted parameter becomes a `[B, ...]` expansion of the shared one
        and the step is one plain `torch.autograd.grad` of the sum of the B task losses:
        the tasks are independent, so the gradient of the sum w.r.t. task b's copy is
        task b's own gradient. Second-order meta-gradients flow back through the updates
        and the expansion into the shared parameters by ordinary autograd, and the inner
        gradients never touch `.grad` (under DDP the only all-reduce is the outer
        backward). Unbatched, the same runs for one task.

        Returns:
            The adapted parameters (only `names`; `[B, ...]` when batched) and the
            support loss before each step, `[B, steps]` or `[steps]` (detached).
        """
        shape = (x.shape[0],) if batched else ()
        fast = {
            n: params[n].expand(*shape, *params[n].shape) if batched else params[n] for n in names
        }
        fixed = {n: p for n, p in params.items() if n not in fast}
        build_graph = torch.is_grad_enabled()
        create_graph = build_graph and not self.first_order
        losses = []
        for step in range(steps):
            with torch.enable_grad():
                if not build_graph:
                    fast = {n: v.detach().requires_grad_() for n, v in fast.items()}
                if step == 0 and build_graph and not batched:
                    # `fast` is still the model's own parameters: a plain call is the
                    # same function without functional_call's parameter swapping.
                    prediction = self.model(x)
                else:
                    prediction = self._run_model(fast, fixed, buffers, x, batched)
                loss = self._losses(prediction, y, batched)
                grads = torch.autograd.grad(
                    loss.sum() if batched else loss, list(fast.values()), create_graph=create_graph
                )
            losses.append(loss)
            with torch.set_grad_enabled(build_graph):
                fast = {
                    n: _sgd_step(fast[n], self.step_size(step, n), g)
                    for n, g in zip(names, grads, strict=True)
                }
        if not build_graph:
            fast = {n: v.detach() for n, v in fast.items()}
        with torch.no_grad():  # detached, in one op rather than one per step
            support_losses = torch.stack(losses, dim=-1) if losses else x.new_zeros(*shape, 0)
        return fast, support_losses

    def _run_model(
        self, fast: Params, fixed: Params, buffers: Params, x: Tensor, batched: bool
    ) -> Tensor:
        """The model on `x` with parameters `fast` (`[B, ...]` when batched) and `fixed`
        (shared by all tasks). Batched: `x [B, N, ...]` → `[B, N, ...]`, through the
        model's own `batched_forward` where it has one, else `vmap` of `functional_call`."""
        if not batched:
            return functional_call(
                self.model, ({**fixed, **fast}, buffers), (x,), tie_weights=self._tie_weights
            )
        if self._native_batching:
            num_tasks = x.shape[0]
            full = {
                n: fast[n] if n in fast else fixed[n].expand(num_tasks, *fixed[n].shape)
                for n in (*fixed, *fast)
            }
            return self.model.batched_forward(full, x)

        def call(task_params: Params, task_x: Tensor) -> Tensor:
            return functional_call(
                self.model,
                ({**fixed, **task_params}, buffers),
                (task_x,),
                tie_weights=self._tie_weights,
            )

        return vmap(call, randomness="different")(fast, x)

    def _unadapted(self, x: Tensor, batched: bool) -> Tensor:
        """The model with its own parameters on `x` (`[B, N, ...]` when batched): a plain
        call (`vmap`ped over B, or the model's `batched_forward`), which skips
        `functional_call`'s parameter swapping."""
        if not batched:
            return self.model(x)
        if self._native_batching:
            return self._run_model({}, dict(self.model.named_parameters()), {}, x, True)
        return vmap(self.model, randomness="different")(x)

    def _losses(self, prediction: Tensor, target: Tensor, batched: bool) -> Tensor:
        """Per-task losses `[B]` when batched, else the one task's scalar loss."""
        if not batched:
            return task_loss(self.loss, prediction, target)
        return task_losses(self.loss, prediction, target)

    def _dispatch(self, fn: Callable, *task_args: Any) -> Any:
        """`fn(batched, *task_args)` for all tasks at once (`batched=True`, leading task dim
        of every tensor in `task_args`) or, in the fallback, `fn(False, ...)` once per task
        with the outputs stacked along a new leading task dim."""
        if self.vectorize and not self._vmap_failed:
            try:
                return fn(True, *task_args)
            except Exception as error:  # noqa: BLE001  (retried by the loop just below)
                vmap_error = error
            result = self._loop(fn, task_args)
            # Only once the loop has succeeded is the failure the model's vmap support,
            # not a bug the loop would have raised too (which then propagates unchained).
            self._vmap_failed = True
            message = str(vmap_error).strip()
            self._warn_fallback(
                message.splitlines()[0][:200] if message else type(vmap_error).__name__
            )
            return result
        return self._loop(fn, task_args)

    @staticmethod
    def _loop(fn: Callable, task_args: tuple) -> Any:
        num_tasks = _num_tasks(task_args)
        outputs = [fn(False, *tree_map(lambda t, i=i: t[i], task_args)) for i in range(num_tasks)]
        return tree_map(lambda *xs: torch.stack(xs), *outputs)

    def _warn_fallback(self, reason: str) -> None:
        key = (type(self).__qualname__, type(self.model).__qualname__, reason.split(" ")[0])
        if key in _WARNED_FALLBACK:
            return
        _WARNED_FALLBACK.add(key)
        logger.warning(
            "learner %r: vmap cannot batch model %s (%s); running tasks in a per-task loop "
            "(vectorize=False selects this directly)",
            self.name,
            type(self.model).__name__,
            reason,
        )

    def _check_usage(self, params: Params, buffers: Params, support: TaskSet) -> None:
        """Once per learner: every adapted parameter must get a gradient from the loss."""
        if self._usage_checked:
            return
        names = self.adapted_names(params)
        if not names:
            raise RuntimeError(
                f"learner {self.name!r}: the model has no trainable parameter to adapt"
            )
        with torch.enable_grad():
            prediction = self._run_model(params, {}, buffers, support.x[0], False)
            loss = task_loss(self.loss, prediction, support.y[0])
            grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        missing = [n for n, g in zip(names, grads, strict=True) if g is None]
        if missing:
            raise RuntimeError(
                f"learner {self.name!r}: parameter(s) {', '.join(missing)} get no gradient "
                "from the loss, so the inner loop cannot adapt them; use them in forward() or "
                "freeze them with requires_grad_(False)"
            )
        self._usage_checked = True

    def _raise_if_not_finite(self, support_losses: Tensor, query_losses: Tensor | None) -> None:
        """`support_losses [B, steps]` and `query_losses [B]` must be finite."""
        if not self.check_finite:
            return
        finite = torch.isfinite(support_losses).all()
        if query_losses is not None:
            finite = finite & torch.isfinite(query_losses).all()
        if bool(finite):  # the one host sync of the check
            return
        if support_losses.numel() and not bool(torch.isfinite(support_losses).all()):
            task_index, step = (~torch.isfinite(support_losses)).nonzero()[0].tolist()
            value = support_losses[task_index, step].item()
            raise RuntimeError(
                f"learner {self.name!r}: support loss is {value} at inner step {step} "
                f"(0 = before the first update) of task {task_index} in the batch; the inner "
                f"loop diverged or the inputs hold NaN/inf — lower inner_lr or check the data"
            )
        if query_losses is not None and not bool(torch.isfinite(query_losses).all()):
            task_index = int((~torch.isfinite(query_losses)).nonzero()[0, 0])
            raise RuntimeError(
                f"learner {self.name!r}: query loss is {query_losses[task_index].item()} after "
                f"adaptation of task {task_index} in the batch; lower inner_lr or check the data"
            )

    def _metrics(self, out: dict[str, Tensor]) -> dict[str, Tensor]:
        metrics = {"query_loss_after": out["after"].detach().mean()}
        if "before" in out:
            metrics["query_loss_before"] = out["before"].detach().mean()
        if out["support"].numel():
            metrics["support_loss_before"] = out["support"][:, 0].mean()
        for key in ("accuracy_before", "accuracy_after"):
            if key in out:
                metrics["query_" + key] = out[key].mean()
        return metrics

    def _steps(self, field: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._options_error(field, "must be an int >= 0", value)
        return value


def _sgd_step(param: Tensor, step_size: Tensor | float, grad: Tensor) -> Tensor:
    """`param - step_size * grad` as one op (one autograd node instead of two)."""
    if isinstance(step_size, Tensor):
        return torch.addcmul(param, step_size, grad, value=-1)
    return torch.add(param, grad, alpha=-step_size)


def has_batched_forward(model: nn.Module) -> bool:
    """Whether the learners may run `model` through its own `batched_forward`.

    Only when the class that defines `batched_forward` is the one that defines `forward`
    or a subclass of it: a subclass that overrides `forward` alone (and so computes
    something else) must not inherit its parent's batched path.
    """
    batched = _defining_class(type(model), "batched_forward")
    return batched is not None and issubclass(batched, _defining_class(type(model), "forward"))


def _has_tied_tensors(model: nn.Module) -> bool:
    """Whether two parameter/buffer names of `model` share one tensor."""
    named = itertools.chain(
        model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False)
    )
    seen: set[int] = set()
    for _, tensor in named:
        if id(tensor) in seen:
            return True
        seen.add(id(tensor))
    return False


def _defining_class(cls: type, attribute: str) -> type | None:
    return next((c for c in cls.__mro__ if attribute in c.__dict__), None)


def _flag(learner: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"learner {learner!r}: {field} must be true or false, got {value!r}")
    return value


def _num_tasks(task_args: tuple) -> int:
    leaves = [t for arg in task_args for t in (arg.values() if isinstance(arg, dict) else [arg])]
    return int(leaves[0].shape[0])
