"""The functional inner loop of the gradient-based learners.

The model's parameters are a dict and the model is called through
`torch.func.functional_call`. The B tasks of a batch adapt together: every adapted
parameter is expanded to `[B, ...]`, the model runs on all tasks at once (`vmap` of
`functional_call`, or the model's own `batched_forward`), and each inner step is one
`torch.autograd.grad` of the sum of the per-task losses. Second-order meta-gradients come
from ordinary autograd through the updates and the expansion: the inner gradients never
touch `.grad`, so under DDP the only all-reduce is the outer backward. Unbatched, the
same code runs for one task (`metadist.learners.dispatch` decides which). Models that
write out their own backward (`batched_vjp`: the MLP, the forecaster) skip
`torch.autograd.grad` in the batched inner loop (`metadist.learners.explicit_grad`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from metadist.batch import TaskSet
from metadist.learners.adam_update import Moments, adam_steps
from metadist.learners.batching import has_batched_vjp
from metadist.learners.explicit_grad import explicit_inner_grads
from metadist.learners.losses import _accuracy, task_loss, task_losses
from metadist.learners.proto_head import PrototypeHead

Params = dict[str, Tensor]


class FunctionalInnerLoop:
    """Mixin of `InnerLoopLearner`: adapting tasks on their support sets and scoring them.

    Uses the learner's options (`loss`, `first_order`, `unadapted_metrics`,
    `check_finite`), its hooks `adapted_names` and `step_size`, `_tie_weights` /
    `_native_batching`, which say how the model is called, and `_usage_checked` (the
    learner starts with False; `_check_usage` runs once).
    """

    name: ClassVar[str]
    model: nn.Module
    loss: str
    first_order: bool
    check_finite: bool
    unadapted_metrics: bool
    _tie_weights: bool
    _native_batching: bool
    _usage_checked: bool
    shared_head: tuple[str, int] | None
    # Proto-MAML: each task's head rows start at its support prototypes (`proto_head`).
    prototype_head: PrototypeHead | None = None
    _state: Callable[[], tuple[Params, Params]]
    # Hooks, defined (and documented) by `InnerLoopLearner`.
    adapted_names: Callable[..., list[str]]
    step_size: Callable[[int, str], Tensor | float]

    def inner_optimizer(self) -> str:
        """The inner loop's update now: "sgd" (`param − lr · grad`) here; a learner
        may step by "adam" (`learners.adam_update`, one state per task)."""
        return "sgd"

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
        on_step: Callable[[int, Params], None] | None = None,
    ) -> dict[str, Any]:
        """Adapts the tasks and scores them on their query sets.

        With `batched`, every tensor has a leading task dim B and the outputs are per
        task (`after [B]`, `support [B, steps]`, ...); without, it is one task's.
        `keep_fast` adds the adapted parameters under "fast"; `on_step` is passed to
        `_inner_loop`.
        """
        fast, support_losses = self._inner_loop(
            params, buffers, names, steps, batched, support_x, support_y, on_step
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
        on_step: Callable[[int, Params], None] | None = None,
    ) -> tuple[Params, Tensor]:
        """`steps` gradient steps on the support set `(x, y)`; `on_step(step, fast)`, if
        given, sees the adapted parameters after each step (`_update` makes the step).

        Batched, each adapted parameter becomes a `[B, ...]` expansion of the shared one
        and the step is one plain `torch.autograd.grad` of the sum of the B task losses:
        the tasks are independent, so the gradient of the sum w.r.t. task b's copy is
        task b's own gradient. Second-order meta-gradients flow back through the updates
        and the expansion into the shared parameters by ordinary autograd, and the inner
        gradients never touch `.grad` (under DDP the only all-reduce is the outer
        backward). Unbatched, the same runs for one task.

        A model with its own `batched_vjp` and a loss of `explicit_grad.PREDICTION_GRADS`
        take the gradient written out instead (`learners.explicit_grad`): the first step
        runs on the shared parameters themselves, and the adapted parameters are plain
        differentiable functions of them, so the outer backward needs no double backward.

        Returns:
            The adapted parameters (only `names`; `[B, ...]` when batched) and the
            support loss before each step, `[B, steps]` or `[steps]` (detached).
        """
        shape = (x.shape[0],) if batched else ()
        # With a written-out gradient the tasks start from the shared parameters
        # themselves (one matmul per layer over all tasks); else from [B, ...] expansions.
        explicit = shared = batched and self._explicit_grads()
        fast = {
            n: params[n].expand(*shape, *params[n].shape) if batched and not shared else params[n]
            for n in names
        }
        fixed = {n: p for n, p in params.items() if n not in fast}
        build_graph = torch.is_grad_enabled()
        create_graph = build_graph and not self.first_order
        if self.prototype_head is not None:  # per-task rows: the autograd path, expanded
            if shared:
                fast = {n: p.expand(*shape, *p.shape) for n, p in fast.items()}
            explicit = shared = False
            fast = self.prototype_head.initial_rows(
                lambda f: self._run_model(f, fixed, buffers, x, batched), fast, y, build_graph
            )
        losses, moments = [], None
        for step in range(steps):
            found = None
            if explicit:
                found = explicit_inner_grads(
                    self.model, self.loss, {**fixed, **fast}, names, x, y, create_graph
                )
                explicit = found is not None
            if shared and found is None:  # the autograd path takes [B, ...] tensors
                fast = {n: p.expand(*shape, *p.shape) for n, p in fast.items()}
            # A shared parameter minus its per-task gradients broadcasts to [B, ...]: no
            # expansion (nor its backward node) on the written-out path.
            shared = False
            if found is None:
                loss, grads = self._autograd_step(
                    fast, fixed, buffers, step, batched, build_graph, create_graph, x, y
                )
            else:
                loss, grads = found
            losses.append(loss)
            with torch.set_grad_enabled(build_graph):
                fast, moments = self._update(fast, names, step, grads, moments)
                if on_step is not None:
                    on_step(step, fast)
        if shared:  # no step taken
            fast = {n: p.expand(*shape, *p.shape) for n, p in fast.items()}
        if not build_graph:
            fast = {n: v.detach() for n, v in fast.items()}
        with torch.no_grad():  # detached, in one op rather than one per step
            support_losses = torch.stack(losses, dim=-1) if losses else x.new_zeros(*shape, 0)
        return fast, support_losses

    def _update(
        self,
        fast: Params,
        names: list[str],
        step: int,
        grads: tuple[Tensor, ...],
        moments: list[Moments] | None,
    ) -> tuple[Params, list[Moments] | None]:
        """One inner step's update of `fast`: SGD's, or Adam's from `moments` (one state
        per task: their shape is the gradients'; None before the first step)."""
        sizes = [self.step_size(step, n) for n in names]
        if self.inner_optimizer() == "adam":
            return adam_steps(fast, sizes, grads, moments, step)
        return _sgd_steps(fast, sizes, grads), None

    def _autograd_step(
        self,
        fast: Params,
        fixed: Params,
        buffers: Params,
        step: int,
        batched: bool,
        build_graph: bool,
        create_graph: bool,
        x: Tensor,
        y: Tensor,
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One inner step's loss (per task when batched) and gradients by autograd."""
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
        return loss, grads

    def _explicit_grads(self) -> bool:
        """Whether the batched inner loop takes its gradients from the model's own
        `batched_vjp` (`learners.explicit_grad`), decided once per learner."""
        known = self.__dict__.get("_batched_vjp")
        if known is None:
            known = self._native_batching and has_batched_vjp(self.model)
            self.__dict__["_batched_vjp"] = known
        return known

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
        call, which skips `functional_call`'s parameter swapping. Batched, a model with its
        own `batched_forward` (whose `forward` maps `[..., *input_shape]` example by
        example, as the learners require) takes all B tasks in one call, its shared
        weights in one matmul per layer instead of B expanded copies; other models are
        `vmap`ped over B."""
        if not batched:
            return self.model(x)
        if self._native_batching:
            if self.shared_head is None:
                return self.model(x)
            return self._run_model({}, self._state()[0], {}, x, True)
        return vmap(self.model, randomness="different")(x)

    def _losses(self, prediction: Tensor, target: Tensor, batched: bool) -> Tensor:
        """Per-task losses `[B]` when batched, else the one task's scalar loss."""
        if not batched:
            return task_loss(self.loss, prediction, target)
        return task_losses(self.loss, prediction, target)

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


def _sgd_steps(fast: Params, step_sizes: list[Tensor | float], grads: tuple[Tensor, ...]) -> Params:
    """`param - step_size * grad` for every parameter of `fast` (in order).

    One fixed step size for all (plain MAML): one fused `torch._foreach_add` (one call,
    one autograd node for the whole update). Learned or per-parameter step sizes: one
    `addcmul`/`add` per parameter (one autograd node each instead of two).
    """
    first = step_sizes[0]
    if all(not isinstance(s, Tensor) and s == first for s in step_sizes):
        updated = torch._foreach_add(list(fast.values()), grads, alpha=-float(first))
        return dict(zip(fast, updated, strict=True))
    return {
        n: torch.addcmul(p, s, g, value=-1) if isinstance(s, Tensor) else torch.add(p, g, alpha=-s)
        for (n, p), s, g in zip(fast.items(), step_sizes, grads, strict=True)
    }
