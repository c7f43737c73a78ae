"""The learner protocol and the shared functional inner loop.

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
backward. Whether a model runs batched is decided once per learner, at its first call:
a model `vmap` cannot batch (and only such a limitation) runs the same code one task at a
time from then on, with one logged notice; after that decision any error raises.

The registry lives in `metadist.learners.registry`, the losses in `.losses`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_map

from metadist.batch import MetaBatch, TaskSet
from metadist.learners.batching import (
    _has_tied_tensors,
    _num_tasks,
    has_batched_forward,
    is_vmap_limitation,
)
from metadist.learners.heads import expand_shared_rows, share_head_rows
from metadist.learners.losses import LOSSES, _accuracy, task_loss, task_losses
from metadist.options import from_mapping

logger = logging.getLogger("metadist.learners")

Params = dict[str, Tensor]

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


class Learner(nn.Module, ABC):
    """Base of every learner.

    Args:
        model: any `nn.Module` mapping `[..., *input_shape]` → `[..., *output_shape]`.
        **options: the fields of the learner's `Options` dataclass (below; a subclass
            declares only the options it adds, in an `Options` that extends its parent's).
            They are read into `self.options`.

    Raises:
        ValueError: an unknown option (naming `learner.options.<key>` and the closest
            valid one), a value of the wrong type, or a bad value.
    """

    @dataclass(frozen=True)
    class Options:
        """Options every learner has.

        Attributes:
            loss: "mse", "mae", "smape" or "mape" (regression, forecasting; see
                `REGRESSION_LOSSES`) or "cross_entropy" (classification).
            vectorize: run the tasks of a batch together (batched inner loops); False
                forces a per-task Python loop.
        """

        loss: str = "mse"
        vectorize: bool = True

    name: ClassVar[str] = ""
    # False for learners with no inner loop (Prototypical Networks): their model without
    # adaptation means nothing, so evaluation scores no "unadapted" row for them.
    has_inner_loop: ClassVar[bool] = True

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ValueError(
                f"learner {self.name!r}: model must be an nn.Module, got {type(model)}"
            )
        self.options: Any = self.read_options(options)
        loss = self.options.loss
        if loss not in LOSSES:
            raise ValueError(f"learner {self.name!r}: loss must be one of {LOSSES}, got {loss!r}")
        self.model = model
        self.loss = loss
        self.vectorize = self.options.vectorize

    @classmethod
    def read_options(cls, options: Mapping[str, Any]) -> Any:
        """`options` as the class's `Options` (see `metadist.registry.options_schema`)."""
        from metadist.registry import options_schema

        return from_mapping(
            options_schema(cls, positional=1),
            options,
            "learner.options",
            what=f"option of learner {cls.name or cls.__name__!r}",
        )

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
        **options: the fields of `InnerLoopLearner.Options` (below).

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

    @dataclass(frozen=True)
    class Options(Learner.Options):
        """Options of every gradient-based learner (and `Learner`'s `loss`, `vectorize`).

        Attributes:
            inner_steps: gradient steps on the support set per task during training (≥ 0).
            inner_lr: step size of the inner loop (the initial value where it is learned).
            eval_inner_steps: steps `adapt` takes in eval mode (`learner.eval()`);
                defaults to `inner_steps`. `adapt(support, steps=N)` overrides both.
            first_order: drop the second-order terms (the inner gradients are treated as
                constants in the meta-gradient).
            check_finite: raise when a support or query loss is NaN/inf (costs one host
                sync per call).
            unadapted_metrics: also score the unadapted model on each query set for the
                `query_loss_before` metric (one extra no-grad forward per task).
            shared_head: classification: every way's row of the model's linear head starts
                each task from one shared learned row and bias (Unicorn-MAML), so the
                adapted predictions do not depend on the order of the way labels. The
                model's head is replaced in place (`learners.heads.share_head_rows`).

        With `vectorize` (default) the tasks run batched. A model `vmap` cannot batch
        (recurrent layers, batch norm updating running statistics) runs a per-task loop
        instead, decided at the first call with one logged notice; False forces the loop.
        """

        inner_steps: int = 1
        inner_lr: float = 0.01
        eval_inner_steps: int | None = None
        first_order: bool = False
        check_finite: bool = True
        unadapted_metrics: bool = True
        shared_head: bool = False

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        opts = self.options
        # (head name, N) when the head's N rows start from one shared row, else None
        self.shared_head = share_head_rows(model, self.name) if opts.shared_head else None
        self.inner_steps = self._steps("inner_steps", opts.inner_steps)
        self.eval_inner_steps = (
            self.inner_steps
            if opts.eval_inner_steps is None
            else self._steps("eval_inner_steps", opts.eval_inner_steps)
        )
        if not opts.inner_lr > 0:
            raise self._options_error("inner_lr", "must be a number > 0", opts.inner_lr)
        self.inner_lr = float(opts.inner_lr)
        self.first_order = opts.first_order
        self.check_finite = opts.check_finite
        self.unadapted_metrics = opts.unadapted_metrics
        # The batching decision, made at the first call in each mode (train/eval): a
        # model vmap cannot batch loops from then on; a mode decided batched stays so and
        # any later error raises.
        self._vmap_failed = False
        self._batched_modes: set[bool] = set()
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
        """The initial parameters of every task's inner loop, and the model's buffers."""
        params: Params = dict(self.model.named_parameters())
        if self.shared_head is not None:
            params = expand_shared_rows(params, *self.shared_head)
        return params, dict(self.model.named_buffers())

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
                if step == 0 and build_graph and not batched and self.shared_head is None:
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
            batched_forward: Any = self.model.batched_forward  # checked: has_batched_forward
            return batched_forward(full, x)

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
            return self._run_model({}, self._state()[0], {}, x, True)
        return vmap(self.model, randomness="different")(x)

    def _losses(self, prediction: Tensor, target: Tensor, batched: bool) -> Tensor:
        """Per-task losses `[B]` when batched, else the one task's scalar loss."""
        if not batched:
            return task_loss(self.loss, prediction, target)
        return task_losses(self.loss, prediction, target)

    def _dispatch(self, fn: Callable, *task_args: Any) -> Any:
        """`fn(batched, *task_args)` for all tasks at once (`batched=True`, leading task dim
        of every tensor in `task_args`) or `fn(False, ...)` once per task with the outputs
        stacked along a new leading task dim.

        The choice is made once per mode, at its first call, and logged: the batched path
        is tried; only if `vmap` refuses the model (`is_vmap_limitation`; never for a
        model's own `batched_forward`) and the per-task loop then succeeds does the
        learner loop from then on. Any other error, and any error after the decision,
        raises.
        """
        if not self.vectorize or self._vmap_failed:
            return self._loop(fn, task_args)
        if self.training in self._batched_modes:
            return fn(True, *task_args)
        try:
            result = fn(True, *task_args)
        except Exception as error:
            if self._native_batching or not is_vmap_limitation(error):
                raise
            vmap_error = error
        else:
            self._batched_modes.add(self.training)
            logger.info(
                "learner %r: model %s runs its tasks batched (%s)",
                self.name,
                type(self.model).__name__,
                "its batched_forward" if self._native_batching else "vmap",
            )
            return result
        result = self._loop(fn, task_args)
        # Only once the loop has succeeded is the failure the model's vmap support, not a
        # bug the loop would have raised too (which then propagates unchained).
        self._vmap_failed = True
        message = str(vmap_error).strip()
        self._warn_fallback(message.splitlines()[0][:200] if message else type(vmap_error).__name__)
        return result

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
