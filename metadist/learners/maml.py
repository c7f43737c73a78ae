"""MAML (Finn et al., 2017): learn an initialisation that adapts in a few gradient steps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from metadist.batch import MetaBatch, TaskSet, check_support
from metadist.learners.base import InnerLoopLearner, MetaOutput, Params
from metadist.learners.heads import SharedRowLinear
from metadist.learners.maml_plus import MetaStepCounter, step_loss_weights, weighted_step_losses
from metadist.learners.proto_head import PrototypeHead
from metadist.learners.registry import register_learner
from metadist.learners.shots import by_shots, support_shots

INNER_OPTIMIZERS = ("sgd", "adam")


@register_learner("maml")
class MAML(InnerLoopLearner):
    """Model-agnostic meta-learning, second order by default.

    The meta-loss is the mean over tasks of the query loss after `inner_steps` gradient
    steps on the support set; its gradient flows back through the inner updates (set
    `first_order=True` for FOMAML). The MAML++ options (Antoniou et al. 2019;
    `metadist.learners.maml_plus`) steady it.

    Args:
        model: any `nn.Module`.
        learn_inner_lr: learn one inner step size per inner step (initialised to
            `inner_lr`, parameter `inner_lrs [inner_steps]`, as in MAML++). Evaluation
            with more steps than `inner_steps` reuses the last learned step size.
        inner_lr_per_layer: with `learn_inner_lr`, one step size per inner step and per
            adapted parameter tensor: `inner_lrs [inner_steps, layers]`, the layers in
            `adapted_names()` order (MAML++'s LSLR).
        multi_step_loss_steps: for the first T meta-steps the meta-loss weighs the query
            losses after every inner step, annealed towards the last
            (`maml_plus.step_loss_weights`); 0 (default) never.
        first_order_steps: first order for the first F meta-steps, then second order
            (MAML++'s derivative-order annealing); 0 (default) never.
        prototype_head: Proto-MAML (Triantafillou et al. 2020; `learners.proto_head`):
            with `shared_head`, the head's input is L2-normalised and each task's rows
            start at its support prototypes (the nearest-centroid classifier) before the
            inner steps. Default false.
        prototype_scale: the prototype rows' scale `s` (logits `-s·|f - μ_c|²` + const
            before the first step); default 10.
        inner_optimizer: the inner loop's update, "sgd" (default, `θ − α·g`) or "adam"
            (Adam's step `θ − α·m̂/(√v̂ + ε)`, `torch.optim.Adam`'s arithmetic with its
            default betas and eps, its moments kept per task and started at zero for
            each adaptation; `learners.adam_update`). Adam's directions are constants of
            the outer graph, so training with it needs `first_order: true`. Adam
            steps a gradient by its sign whatever its size: with `shared_head` alone
            (every row equal before the first step) the body's first gradient is 0 in
            exact arithmetic and its float32 round-off, which depends on the way order,
            moves the body by up to `α`; with `prototype_head` it is not 0.
        eval_inner_optimizer: the update in eval mode (evaluation, meta-val); None
            (default): `inner_optimizer`. Eval mode builds no outer graph, so "adam"
            needs no `first_order` here.
        eval_inner_lr: the step size in eval mode (> 0); None (default): `inner_lr`.
            Not with `learn_inner_lr` (the learned sizes are used in both modes).
        eval_inner_lr_by_shots: classification: `{K: step size}`, the eval-mode step
            size where the support set gives K examples per class (K read from the
            support labels: the fewest of any class; `learners.shots`); a K not listed
            uses `eval_inner_lr`. None (default): none. Not with `learn_inner_lr`;
            needs `loss: cross_entropy`.
        eval_inner_steps_by_shots: classification: `{K: steps}`, the steps `adapt` takes
            in eval mode where the support set gives K examples per class (as
            `eval_inner_lr_by_shots`); a K not listed, or `adapt(steps=...)`, as
            before. None (default): none. Needs `loss: cross_entropy`.
        **options: `InnerLoopLearner.Options`, plus the eleven above.

    Raises:
        ValueError: a bad option, naming it (e.g. `learn_inner_lr` with 0 inner steps,
            `inner_lr_per_layer` without `learn_inner_lr`, a negative
            `multi_step_loss_steps`, `first_order_steps` with `first_order`,
            `prototype_head` without `shared_head` or without a head bias, an unknown
            `inner_optimizer`, "adam" in training without `first_order`, a shot count
            < 1 or a step size <= 0 in `eval_inner_lr_by_shots`, a step count that is
            not an int >= 1 in `eval_inner_steps_by_shots`).
    """

    @dataclass(frozen=True)
    class Options(InnerLoopLearner.Options):
        learn_inner_lr: bool = False
        inner_lr_per_layer: bool = False
        multi_step_loss_steps: int = 0
        first_order_steps: int = 0
        prototype_head: bool = False
        prototype_scale: float = 10.0
        inner_optimizer: str = "sgd"
        eval_inner_optimizer: str | None = None
        eval_inner_lr: float | None = None
        eval_inner_lr_by_shots: dict[int, float] | None = None
        eval_inner_steps_by_shots: dict[int, int] | None = None

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        opts = self.options
        self.learn_inner_lr = opts.learn_inner_lr
        self._check_maml_plus(opts)
        self._check_inner_optimizer(opts)
        self._eval_lr_by_shots = self._check_by_shots(opts)
        self.eval_steps_by_shots: dict[int, int] = self._read_by_shots(
            "eval_inner_steps_by_shots", opts.eval_inner_steps_by_shots, integer=True
        )
        # K of the support set being adapted in eval mode, where a setting depends on it.
        self._support_shots: int | None = None
        self.prototype_head = self._prototype_head(opts)
        if self.learn_inner_lr:
            if self.inner_steps == 0:
                raise self._options_error(
                    "inner_steps", "must be >= 1 when learn_inner_lr is true", self.inner_steps
                )
            reference = next(model.parameters())
            names = self.adapted_names()
            self._layer_index = {n: i for i, n in enumerate(names)}
            shape = (
                (self.inner_steps, len(names)) if opts.inner_lr_per_layer else (self.inner_steps,)
            )
            self.inner_lrs = nn.Parameter(
                torch.full(shape, self.inner_lr, dtype=reference.dtype, device=reference.device)
            )
        # Training meta-steps taken, where a MAML++ schedule reads them.
        self.meta_steps: MetaStepCounter | None = None
        if opts.multi_step_loss_steps > 0 or opts.first_order_steps > 0:
            self.meta_steps = MetaStepCounter()

    def _check_maml_plus(self, opts: Any) -> None:
        for field in ("multi_step_loss_steps", "first_order_steps"):
            value = getattr(opts, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise self._options_error(field, "must be an int >= 0", value)
        if opts.inner_lr_per_layer and not opts.learn_inner_lr:
            raise self._options_error(
                "inner_lr_per_layer", "needs learn_inner_lr: true", opts.inner_lr_per_layer
            )
        if opts.first_order_steps > 0 and opts.first_order:
            raise self._options_error(
                "first_order_steps",
                "has no effect with first_order: true (set it to 0)",
                opts.first_order_steps,
            )
        if opts.multi_step_loss_steps > 0 and self.inner_steps == 0:
            raise self._options_error(
                "multi_step_loss_steps", "needs inner_steps >= 1", opts.multi_step_loss_steps
            )

    def _check_inner_optimizer(self, opts: Any) -> None:
        for field in ("inner_optimizer", "eval_inner_optimizer"):
            value = getattr(opts, field)
            if value not in INNER_OPTIMIZERS and not (field.startswith("eval") and value is None):
                raise self._options_error(field, f"must be one of {INNER_OPTIMIZERS}", value)
        if opts.inner_optimizer == "adam" and not opts.first_order:
            raise self._options_error(
                "inner_optimizer",
                "'adam' needs first_order: true (its directions are constants of the "
                "meta-gradient)",
                opts.inner_optimizer,
            )
        rate = opts.eval_inner_lr
        if rate is None:
            return
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise self._options_error("eval_inner_lr", "must be a number > 0 or null", rate)
        if opts.learn_inner_lr:
            raise self._options_error(
                "eval_inner_lr", "has no effect with learn_inner_lr: true (set it to null)", rate
            )

    def _check_by_shots(self, opts: Any) -> dict[int, float]:
        rates = self._read_by_shots("eval_inner_lr_by_shots", opts.eval_inner_lr_by_shots)
        if rates and opts.learn_inner_lr:
            raise self._options_error(
                "eval_inner_lr_by_shots",
                "has no effect with learn_inner_lr: true (set it to null)",
                opts.eval_inner_lr_by_shots,
            )
        return rates

    def _read_by_shots(self, field: str, value: Any, integer: bool = False) -> dict:
        """`{K: setting}` of the option `field` (`learners.shots.by_shots`; step counts
        with `integer`), refused in one line naming it where bad or without a
        classification loss."""
        try:
            settings = by_shots(value, integer=integer)
        except ValueError as error:
            raise self._options_error(field, str(error), value) from None
        if settings and self.loss != "cross_entropy":
            raise self._options_error(
                field, "needs loss: cross_entropy (shots are examples per class)", value
            )
        return settings

    @contextmanager
    def _reading_shots(self, support: TaskSet) -> Iterator[None]:
        """Within: the support set's K known to `step_size` and `adapt` (eval mode, where
        `eval_inner_lr_by_shots` or `eval_inner_steps_by_shots` is set), read once."""
        if not (self._eval_lr_by_shots or self.eval_steps_by_shots) or self.training:
            yield
            return
        self._support_shots = support_shots(support.y)
        try:
            yield
        finally:
            self._support_shots = None

    def adapt(self, support: TaskSet, steps: int | None = None) -> Params:
        """`InnerLoopLearner.adapt`, with the step size and step count of the support
        set's shot count where `eval_inner_lr_by_shots` / `eval_inner_steps_by_shots`
        give them (eval mode, `steps` not given)."""
        check_support(support)
        with self._reading_shots(support):
            if steps is None and self._support_shots is not None:
                steps = self.eval_steps_by_shots.get(self._support_shots)
            return super().adapt(support, steps)

    def inner_optimizer(self) -> str:
        """`eval_inner_optimizer` in eval mode where it is set, else `inner_optimizer`."""
        evaluating = self.options.eval_inner_optimizer
        return (
            evaluating
            if evaluating is not None and not self.training
            else self.options.inner_optimizer
        )

    def _prototype_head(self, opts: Any) -> PrototypeHead | None:
        if not opts.prototype_head:
            return None
        if self.shared_head is None:
            raise self._options_error(
                "prototype_head", "needs shared_head: true", opts.prototype_head
            )
        scale = opts.prototype_scale
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0:
            raise self._options_error("prototype_scale", "must be a number > 0", scale)
        name, num_ways = self.shared_head
        head = self.model.get_submodule(name)
        assert isinstance(head, SharedRowLinear)  # share_head_rows installed it
        if head.bias is None:
            raise self._options_error(
                "prototype_head", f"needs the model's head {name!r} to have a bias", True
            )
        head.normalise_input = True
        # a model's own batched path applies its head as a plain linear layer on the
        # parameters, without the normalised input: the tasks run through vmap of the
        # model's modules instead, which calls the head
        self._native_batching = False
        return PrototypeHead(name, num_ways, float(scale))

    def step_size(self, step: int, name: str) -> Tensor | float:
        if not self.learn_inner_lr:
            if self.training:
                return self.inner_lr
            rate = self._eval_lr_by_shots.get(self._support_shots)  # type: ignore[arg-type]
            if rate is None:
                rate = self.options.eval_inner_lr
            return self.inner_lr if rate is None else float(rate)
        rates = self.inner_lrs[min(step, self.inner_steps - 1)]
        return rates[self._layer_index[name]] if rates.dim() else rates

    def forward(self, batch: MetaBatch) -> MetaOutput:
        """As `InnerLoopLearner.forward`, with the MAML++ schedules at this meta-step; a
        training call (train mode, grad enabled) counts one meta-step."""
        counting = self.meta_steps is not None and self.training and torch.is_grad_enabled()
        if self.meta_steps is not None:
            seen = self.meta_steps.value
            self.first_order = self.options.first_order or seen < self.options.first_order_steps
        with self._reading_shots(batch.support):
            out = super().forward(batch)
        if counting:
            assert self.meta_steps is not None
            self.meta_steps.advance()
        return out

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
        on_step: Any = None,
    ) -> dict[str, Any]:
        """`InnerLoopLearner._score`, plus the multi-step meta-loss (`meta_loss`, per
        task) while its schedule lasts, in training."""
        weights = None
        if self.meta_steps is not None and self.training and torch.is_grad_enabled():
            weights = step_loss_weights(
                steps, self.meta_steps.value, self.options.multi_step_loss_steps
            )
        if weights is None:
            return super()._score(
                params, buffers, names, steps, batched, support_x, support_y, query_x,
                query_y, keep_fast, on_step,
            )  # fmt: skip
        fixed = {n: p for n, p in params.items() if n not in names}
        step_losses: list[Tensor] = []

        def query_loss(step: int, fast: Params) -> None:
            if step < steps - 1:  # the last step's is `after`, computed anyway
                prediction = self._run_model(fast, fixed, buffers, query_x, batched)
                step_losses.append(self._losses(prediction, query_y, batched))

        out = super()._score(
            params, buffers, names, steps, batched, support_x, support_y, query_x, query_y,
            keep_fast, query_loss,
        )  # fmt: skip
        out["meta_loss"] = weighted_step_losses([*step_losses, out["after"]], weights)
        return out
