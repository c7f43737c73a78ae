"""One meta-step (forward, backward, update) with a step guard that needs no host sync.

A meta-step whose meta-loss (on any rank) or meta-gradient is NaN/inf must never be
applied. Reading that from the device costs a host sync, which on a GPU stalls the
queue of kernels every step. `MetaStep` keeps the verdict on the device instead:

- `ok` (a 0-dim bool tensor) is true while every step so far was finite, and stays
  false from the first non-finite step on; `bad_step` records that step's number;
- the update of a step is applied through a mask: parameters and optimizer state are
  copied before `optimizer.step()` and put back where `ok` is false, so neither the
  non-finite step nor any step after it changes anything;
- the host reads `ok`, the sums of the loss and metrics, and the ranks' stop flags only
  on the steps the loop asks it to (`sync=True`: every `check_every` steps and before
  every metrics record, evaluation and checkpoint), in one transfer. A read that finds
  a non-finite step returns it before this step's update, so the loop raises with the
  parameters as they were before that step.

Every rank takes the same decision without a collective of its own: DDP averages the
meta-gradient, so a non-finite gradient on one rank is non-finite on all, and the
per-step loss vector is summed over ranks (asynchronously on NCCL).

With `sync` on every step (`check_every=1`, the CPU default) no mask is needed: the
verdict is read before the update, exactly as a plain loop would.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from metadist.train.compile_check import cannot_compile_reason
from metadist.train.distributed import DistEnv, all_reduce_sum

DEFAULT_GPU_CHECK_EVERY = 16


def resolved_check_every(check_every: int | None, device: torch.device) -> int:
    """`trainer.check_every`, with `None` resolved for `device` (1 on CPU, 16 on GPU)."""
    if check_every is not None:
        return check_every
    return 1 if device.type == "cpu" else DEFAULT_GPU_CHECK_EVERY


def compile_options(device: torch.device) -> dict[str, Any]:
    """The keyword arguments of `torch.compile` with which `trainer.compile=true` compiles
    the meta-step on `device`.

    GPU: `mode="reduce-overhead"` (CUDA graphs). CPU: Inductor's C++ wrapper
    (`cpp_wrapper`), which calls each compiled graph's kernels from generated C++ instead
    of a generated Python function: on the sinusoid MAML meta-step (a few hundred small
    kernels) it took 18 % off the compiled step (BENCHMARKS.md, "Batched learners"), at the
    price of a longer first compilation.
    """
    if device.type == "cuda":
        return {"mode": "reduce-overhead"}
    if device.type == "cpu":
        return {"options": {"cpp_wrapper": True}}
    return {}


@dataclass
class StepReading:
    """What the host learned at a read.

    Attributes:
        loss: the last step's meta-loss (mean over all ranks' tasks).
        sums: loss and metric name → sum over the steps since the previous read of each
            step's mean over all ranks' tasks.
        num_steps: how many steps `sums` covers.
        bad_step: the first meta-step (1-based) whose loss or gradient was not finite,
            or `None`.
        stop: whether any rank was asked to stop.
    """

    loss: float
    sums: dict[str, float]
    num_steps: int
    bad_step: int | None
    stop: bool


class MetaStep:
    """Runs meta-steps on `model` (the learner, possibly DDP-wrapped) with the step guard.

    Args:
        model: what is called on a batch; returns a `MetaOutput`.
        learner: the unwrapped learner (its parameters are updated).
        optimizer: the meta-optimizer.
        env: this rank's place in the run.
        check_every: the loop's read interval (masking is set up when it exceeds 1).
        grad_clip: max global norm of the meta-gradient, or `None`.
        compile: run forward and backward through `torch.compile` (`compile_options`).
        precision: `fp32` or `bf16` (autocast of the forward).
        stop_requested: whether this rank was asked to stop (read at each sync).
        message: where the lines about compiling go (that it compiles, how long it took,
            or why it runs eagerly).
    """

    def __init__(
        self,
        model: nn.Module,
        learner: nn.Module,
        optimizer: torch.optim.Optimizer,
        env: DistEnv,
        *,
        check_every: int = 1,
        grad_clip: float | None = None,
        compile: bool = False,
        precision: str = "fp32",
        stop_requested: Callable[[], bool] = lambda: False,
        message: Callable[[str], None] = print,
    ) -> None:
        self.model, self.learner, self.optimizer, self.env = model, learner, optimizer, env
        self.grad_clip = grad_clip
        self.precision = precision
        self.masked = check_every > 1
        self._message = message
        self._stop_requested = stop_requested
        self._params: list[Tensor] = [p for p in learner.parameters() if p.requires_grad]
        device = env.device
        self.ok = torch.ones((), dtype=torch.bool, device=device)
        self.bad_step = torch.zeros((), dtype=torch.int64, device=device)
        self._sums: Tensor | None = None
        self._saved: list[Tensor] = []  # the masked update's copies
        self._last: Tensor | None = None
        self._count = 0
        self._names: list[str] | None = None
        if self.masked:
            _state_on_device(optimizer)
        self._run = self._forward_backward
        self.compiled = False
        self._traced = False
        self._compile_timed = False  # the first compiled call (which compiles) was timed
        # every step so far read, and finite: a read then needs no device-side record
        self._clean = True
        reason = cannot_compile_reason(learner) if compile else None
        if reason is not None:
            message(f"trainer.compile: not compiling the meta-step ({reason}); running eagerly")
        elif compile:
            try:
                self._run = torch.compile(self._forward_backward, **compile_options(device))
                self.compiled = True
                message("trainer.compile: compiling the meta-step; the first steps take longer")
            except Exception as error:  # noqa: BLE001  (reported, then eager)
                self._fall_back(error)

    # ------------------------------------------------------------------ public
    def __call__(self, batch: Any, step: int, lr: float, *, sync: bool) -> StepReading | None:
        """Meta-step `step + 1` on `batch` at learning rate `lr`.

        Returns:
            With `sync`, the reading (whose `bad_step`, when set, means this step's update
            was not applied: the caller must stop); else `None`.
        """
        self.optimizer.zero_grad(set_to_none=True)
        local = self._forward_backward_once(batch)
        if sync:
            stop = torch.tensor([float(bool(self._stop_requested()))], device=self.env.device)
            local = torch.cat([local, stop])
        totals = all_reduce_sum(local, self.env)
        if sync and self._count == 0 and self._clean:
            reading: StepReading | None = self._read_this_step(totals, step)
        else:
            reading = self._accumulate(totals, step, sync)
        if reading is not None and reading.bad_step is not None:
            return reading
        if self.grad_clip is not None:
            nn.utils.clip_grad_norm_(self._params, self.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if sync:  # read above: this step is finite
            self.optimizer.step()
        else:
            self._masked_update()
        return reading

    # --------------------------------------------------------------- internals
    def _accumulate(self, totals: Tensor, step: int, sync: bool) -> StepReading | None:
        """Adds this step's verdict and values to the device-side record; with `sync`,
        reads it."""
        assert self._names is not None  # set by the first forward
        num_values = 1 + len(self._names)
        means = totals[:num_values] / self.env.world_size
        finite = totals[num_values] == 0
        self.bad_step = torch.where(self.ok & ~finite, step + 1, self.bad_step)
        self.ok = self.ok & finite
        self._last = means
        means64 = means.double()
        self._sums = means64 if self._sums is None else self._sums + means64
        self._count += 1
        return self._read(totals) if sync else None

    def _read_this_step(self, totals: Tensor, step: int) -> StepReading:
        """The read of a step with no unread step before it (the CPU default reads every
        step): this step's values and verdict in one transfer, with none of the device-side
        record's bookkeeping (the same numbers: float32 means, as doubles)."""
        assert self._names is not None  # set by the first forward
        num_values = 1 + len(self._names)
        values = (totals / self.env.world_size).tolist()
        finite = values[num_values] == 0
        if not finite:
            self._clean = False
            self.ok = torch.zeros_like(self.ok)
            self.bad_step = torch.full_like(self.bad_step, step + 1)
        return StepReading(
            loss=values[0],
            sums=dict(zip(["loss", *self._names], values[:num_values], strict=True)),
            num_steps=1,
            bad_step=None if finite else step + 1,
            stop=values[-1] > 0,
        )

    def _read(self, totals: Tensor) -> StepReading:
        """One transfer: loss, sums, verdict and stop flags."""
        # set by the step that calls this (a record of every metric name, the sums)
        assert self._names is not None and self._last is not None and self._sums is not None
        names = ["loss", *self._names]
        packed = torch.cat(
            [
                self._last.double(),
                self._sums,
                self.ok.double().reshape(1),
                self.bad_step.double().reshape(1),
                totals[-1:].double(),
            ]
        ).tolist()
        num = len(names)
        sums = dict(zip(names, packed[num : 2 * num], strict=True))
        ok, bad_step, stop = packed[2 * num :]
        reading = StepReading(
            loss=packed[0],
            sums=sums,
            num_steps=self._count,
            bad_step=None if ok else int(bad_step),
            stop=stop > 0,
        )
        self._sums, self._count = None, 0
        self._clean = self._clean and reading.bad_step is None
        return reading

    def _forward_backward(self, batch: Any) -> Tensor:
        """Forward and backward of `batch`; returns this rank's `[loss, *metrics (sorted
        by name), non-finite flag]` (the flag 1 where the loss or a gradient is NaN/inf):
        everything the step guard reads, packed inside what `compile` compiles."""
        autocast = (
            torch.autocast(self.env.device.type, dtype=torch.bfloat16)
            if self.precision == "bf16"
            else contextlib.nullcontext()
        )
        with autocast:
            output = self.model(batch)
        output.loss.backward()  # DDP all-reduces (averages) the meta-gradient here
        if self._names is None:
            self._names = sorted(output.metrics)
        loss = output.loss.detach()
        # every rank's gradients are the same average: one rank's verdict is all ranks'
        finite = torch.isfinite(loss) & _grads_finite(self._params)
        values = [loss, *(output.metrics[n].reshape(()) for n in self._names), ~finite]
        # one op for all (stack promotes the dtypes: bool, bf16, float32 → float32)
        return torch.stack(values).detach().float()

    def _forward_backward_once(self, batch: Any) -> Tensor:
        # The learner's own finiteness check is a host sync per call, which would also
        # split a compiled graph in two; the step guard covers it where it reads the
        # verdict later (masked) or runs compiled.
        with _quiet_learner(self.learner, self.masked or self.compiled):
            return self._forward_backward_guarded(batch)

    def _forward_backward_guarded(self, batch: Any) -> Tensor:
        if not self.compiled:
            return self._run(batch)
        if not self._traced:
            # The first step runs eagerly: a learner's first call makes its one-time
            # decisions (the usage check, batched or per task, a logged line), which
            # Dynamo would trace as graph breaks kept in every later step.
            self._traced = True
            return self._forward_backward(batch)
        vmap_failed = getattr(self.learner, "_vmap_failed", None)
        try:
            if not self._compile_timed:  # the first compiled call compiles: say how long
                started = time.perf_counter()
                out = self._run(batch)
                self._compile_timed = True
                self._message(
                    f"trainer.compile: compiled the meta-step in "
                    f"{time.perf_counter() - started:.1f} s"
                )
                return out
            return self._run(batch)
        except Exception as error:  # noqa: BLE001  (reported, then the same step eagerly)
            if vmap_failed is not None:
                self.learner._vmap_failed = vmap_failed  # a failure under tracing is not eager's
            self._fall_back(error)
            self.optimizer.zero_grad(set_to_none=True)
            return self._run(batch)

    def _fall_back(self, error: Exception) -> None:
        text = str(error).strip()
        reason = text.splitlines()[0][:160] if text else type(error).__name__
        if "double backward" in text or "create_graph" in text:
            reason = "second-order gradients need a double backward, which compiled graphs lack"
        self._message(f"trainer.compile: cannot compile the meta-step ({reason}); running eagerly")
        self._run = self._forward_backward
        self.compiled = False

    @torch.no_grad()
    def _masked_update(self) -> None:
        """`optimizer.step()`, undone wherever `ok` is false (state it creates is zeroed).

        The copies live in buffers kept from step to step and are taken by one `foreach`
        copy; each tensor is put back by one `where` into itself: on a GPU, about 25
        kernel launches for a model of 6 parameters where a clone, a `where` and a copy
        of each tensor took 72."""
        before = [p for p in self._params]
        fresh = []
        for p in self._params:
            state = self.optimizer.state.get(p)
            if state:
                before += [v for v in state.values() if isinstance(v, Tensor)]
            else:
                fresh.append(p)
        saved = self._saved_like(before)
        torch._foreach_copy_(saved, before)
        self.optimizer.step()
        for tensor, old in zip(before, saved, strict=True):
            torch.where(self.ok, tensor, old, out=tensor)
        keep = self.ok
        for p in fresh:
            for value in self.optimizer.state.get(p, {}).values():
                if isinstance(value, Tensor):
                    value.masked_fill_(~keep, 0)

    def _saved_like(self, tensors: list[Tensor]) -> list[Tensor]:
        """Buffers shaped as `tensors`, made again only when those change (the optimizer
        state appears at the first step)."""
        saved = self._saved
        if len(saved) != len(tensors) or any(
            s.shape != t.shape or s.dtype != t.dtype or s.device != t.device
            for s, t in zip(saved, tensors, strict=True)
        ):
            self._saved = saved = [torch.empty_like(t) for t in tensors]
        return saved


def _grads_finite(params: list[Tensor]) -> Tensor:
    """0-dim bool: every gradient entry is finite (no host sync)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.ones((), dtype=torch.bool, device=params[0].device)
    norms = torch._foreach_norm(grads)
    return torch.isfinite(torch.stack(norms).sum())


def _state_on_device(optimizer: torch.optim.Optimizer) -> None:
    """Keeps every optimizer state tensor on its parameter's device, so that the masked
    update needs no host sync: Adam/AdamW count steps on the GPU (`capturable`)."""
    for group in optimizer.param_groups:
        on_gpu = any(p.device.type != "cpu" for p in group["params"])
        if on_gpu and "capturable" in group:
            group["capturable"] = True
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, Tensor) and value.device != p.device:
                    optimizer.state[p][key] = value.to(p.device)


@contextlib.contextmanager
def _quiet_learner(learner: Any, quiet: bool) -> Iterator[None]:
    """Turns the learner's own finiteness check (a host sync per call) off while the
    step guard covers it: a non-finite support or query loss makes the meta-loss
    non-finite."""
    if not quiet or not getattr(learner, "check_finite", False):
        yield
        return
    learner.check_finite = False
    try:
        yield
    finally:
        learner.check_finite = True
