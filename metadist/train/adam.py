"""Adam without a `torch.optim.Optimizer` object: the same update, none of its start-up cost.

Why it exists: constructing the first `torch.optim.Optimizer` of a process imports
`torch._dynamo` (`Optimizer.add_param_group` is wrapped in `torch._disable_dynamo`, which
imports it on its first call): 1.6 s of CPU on an idle core, twice that on a busy one,
for a process that never compiles anything. The evaluation's baselines (the pretrained
embedding, Baseline++, the from-scratch network) each train a small network once; that
import was a tenth of a first evaluation.

`Adam` keeps `torch.optim.Adam`'s state (per parameter `step`, `exp_avg`, `exp_avg_sq`,
created on the first step that gives the parameter a gradient) and calls the same
function `torch.optim.Adam.step` calls (`torch.optim.adam.adam`), with the same choice of
implementation (by default torch's own: single-tensor on the CPU, `foreach` on CUDA), so
its parameters after any number of steps equal `torch.optim.Adam`'s bit for bit. Its
`state_dict` is `torch.optim.Adam`'s format, so either can load what the other saved.
Supported: Adam's defaults plus `lr`, `betas`, `eps` and the implementation (`fused`,
`foreach`); no weight decay, AMSGrad or `maximize`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.optim.adam import adam


class Adam:
    """`torch.optim.Adam(params, lr, betas, eps, foreach=..., fused=...)`, as a plain object.

    Args:
        params: the tensors to train (leaves; their `.grad` is read by `step()`).
        lr: learning rate, > 0.
        betas: the moments' coefficients, each in [0, 1).
        eps: added to the second moment's root, >= 0.
        fused: True for torch's fused kernel (see `has_fused_adam`), None (default) for
            `torch.optim.Adam`'s own choice.
        foreach: as `torch.optim.Adam`'s (None: its choice).

    Raises:
        ValueError: lr <= 0, betas outside [0, 1) or eps < 0.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        *,
        fused: bool | None = None,
        foreach: bool | None = None,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"Adam: lr must be > 0, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas) or len(betas) != 2:
            raise ValueError(f"Adam: betas must be two numbers in [0, 1), got {betas}")
        if not eps >= 0:
            raise ValueError(f"Adam: eps must be >= 0, got {eps}")
        self.params = list(params)
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.fused, self.foreach = fused, foreach
        self.state: list[dict[str, Tensor]] = [{} for _ in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Sets every parameter's `.grad` to None (or to zeros), as
        `torch.optim.Adam.zero_grad` does."""
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    def step(self, grads: Sequence[Tensor | None] | None = None) -> None:
        """One Adam step of every parameter with a gradient: `grads` (one per parameter,
        in order; None skips one) or, without it, the parameters' `.grad`."""
        if grads is None:
            grads = [p.grad for p in self.params]
        if len(grads) != len(self.params):
            raise ValueError(f"Adam.step: {len(grads)} gradients for {len(self.params)} params")
        triples = zip(self.params, grads, self.state, strict=True)
        chosen = [(p, g, self._state(p, s)) for p, g, s in triples if g is not None]
        if not chosen:
            return
        with torch.no_grad():
            adam(
                [p for p, _, _ in chosen],
                [g for _, g, _ in chosen],  # None filtered out
                [s["exp_avg"] for _, _, s in chosen],
                [s["exp_avg_sq"] for _, _, s in chosen],
                [],
                [s["step"] for _, _, s in chosen],
                foreach=self.foreach,
                fused=self.fused,
                has_complex=any(torch.is_complex(p) for p, _, _ in chosen),
                amsgrad=False,
                beta1=self.betas[0],
                beta2=self.betas[1],
                lr=self.lr,
                weight_decay=0.0,
                eps=self.eps,
                maximize=False,
            )

    def _state(self, p: Tensor, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """`p`'s state, created as `torch.optim.Adam` creates it (`step` on the CPU unless
        fused)."""
        if not state:
            state["step"] = (
                torch.zeros((), dtype=torch.float32, device=p.device)
                if self.fused
                else torch.tensor(0.0, dtype=_scalar_dtype(), device="cpu")
            )
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def state_dict(self) -> dict[str, Any]:
        """The state in `torch.optim.Adam.state_dict()`'s format (tensors not copied)."""
        group = {
            "lr": self.lr,
            "betas": self.betas,
            "eps": self.eps,
            "weight_decay": 0,
            "amsgrad": False,
            "maximize": False,
            "foreach": self.foreach,
            "capturable": False,
            "differentiable": False,
            "fused": self.fused,
            "decoupled_weight_decay": False,
            "params": list(range(len(self.params))),
        }
        state = {i: dict(s) for i, s in enumerate(self.state) if s}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a state `state_dict()` (or `torch.optim.Adam`'s) gave, for the same
        parameters in the same order; moments are cast to each parameter's dtype and
        device, as `torch.optim.Adam.load_state_dict` does.

        Raises:
            ValueError: a state of another number of parameters or parameter groups.
        """
        groups = state_dict.get("param_groups", [])
        indices = [i for g in groups for i in g["params"]]
        if len(groups) != 1 or len(indices) != len(self.params):
            raise ValueError(
                f"Adam.load_state_dict: the state has {len(indices)} parameters in "
                f"{len(groups)} groups, this optimizer {len(self.params)} in 1"
            )
        saved = state_dict.get("state", {})
        for position, (index, p) in enumerate(zip(indices, self.params, strict=True)):
            entry = saved.get(index, {})
            self.state[position] = {
                key: _placed(value, p, key, bool(self.fused)) for key, value in entry.items()
            }


def _scalar_dtype() -> torch.dtype:
    """The dtype of an unfused `step` (`torch.optim.Adam`'s: float64 under a float64
    default dtype, else float32)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _placed(value: Tensor, param: Tensor, key: str, fused: bool) -> Tensor:
    """A loaded state tensor where `torch.optim.Adam` puts it: `step` on the CPU (on the
    parameter's device, float32, when fused), moments in the parameter's dtype/device."""
    if key == "step":
        return value.to(dtype=torch.float32, device=param.device) if fused else value
    return value.to(dtype=param.dtype, device=param.device)


@functools.cache
def has_fused_adam(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch has a fused Adam kernel for tensors of `device` and `dtype` (tried
    once on a one-element tensor)."""
    if not dtype.is_floating_point:
        return False
    probe = [torch.zeros(1, device=device, dtype=dtype)]
    try:
        Adam(probe, fused=True).step([torch.zeros_like(probe[0])])
    except (RuntimeError, NotImplementedError):
        return False
    return True
