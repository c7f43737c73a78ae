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

`InnerLoopLearner` is its options, hooks and protocol; the machinery is in two mixins:
the inner loop in `metadist.learners.inner_loop` and the batched-or-per-task decision in
`metadist.learners.dispatch`. The registry lives in `metadist.learners.registry`, the
losses in `.losses`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from metadist.batch import MetaBatch, TaskSet, check_support
from metadist.learners.batching import _has_tied_tensors, has_batched_forward
from metadist.learners.dispatch import TaskDispatch
from metadist.learners.heads import expand_shared_rows, share_head_rows
from metadist.learners.inner_loop import FunctionalInnerLoop, Params
from metadist.learners.losses import LOSSES
from metadist.options import from_mapping
from metadist.registry import options_schema

# Far above any inner loop in the literature (tens of steps): a typo is refused, not run.
MAX_INNER_STEPS = 10_000

__all__ = ["InnerLoopLearner", "Learner", "MetaOutput", "Params", "has_batched_forward"]


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


class InnerLoopLearner(FunctionalInnerLoop, TaskDispatch, Learner):
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
        # Read here, not only inside `_check_usage`: under `torch.compile` the flag then
        # guards this frame, which is traced again once the one-time check (a graph break)
        # is done, into a graph without it.
        if not self._usage_checked:
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
        # A learner's `_score` may give a meta-loss of its own (MAML++'s multi-step loss).
        return MetaOutput(out.get("meta_loss", out["after"]).mean(), self._metrics(out))

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
        check_support(support)
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

    def _steps(self, field: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._options_error(field, "must be an int >= 0", value)
        if value > MAX_INNER_STEPS:
            raise self._options_error(field, f"must be <= {MAX_INNER_STEPS:,}", value)
        return value
