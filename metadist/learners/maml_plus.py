"""MAML++ (Antoniou et al., 2019, "How to train your MAML"): the options that steady MAML.

Three of the paper's fixes, as options of `maml` (and `anil`, which extends it):

- **Multi-step loss** (`multi_step_loss_steps = T > 0`): for the first T meta-steps the
  meta-loss is a weighted sum of the query losses after every inner step, not only the
  last. The weights start equal (`1/S` each, S inner steps) and are annealed linearly
  over the T meta-steps towards the last step (the others reach `0.03/S`, the paper's
  floor); from meta-step T on, the meta-loss is the last step's query loss alone (plain
  MAML). `step_loss_weights` is the schedule.
- **Per-step, per-layer learned inner rates** (`learn_inner_lr` with
  `inner_lr_per_layer`): one learned step size for every inner step and every adapted
  parameter tensor (a layer's weight and bias apart, as the paper's code does):
  parameter `inner_lrs [inner_steps, layers]`.
- **Annealed first order** (`first_order_steps = F > 0`): first order (FOMAML's
  meta-gradient) for the first F meta-steps, second order from then on.

The learner counts its training meta-steps (calls of `forward` in train mode with grad
enabled) in the buffer `meta_steps_seen`, saved in its `state_dict`, so a resumed run
picks the schedules up where they were. The buffer exists only where a schedule does
(`multi_step_loss_steps` or `first_order_steps` > 0), so checkpoints of runs without
them keep their keys. Per-step batch-norm statistics (the paper's BNRS) are not built.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# The paper's floor for the weight of a non-final step: 0.03 / S.
MIN_STEP_WEIGHT = 0.03


def step_loss_weights(num_steps: int, meta_step: int, anneal_steps: int) -> list[float] | None:
    """Weights `[num_steps]` of the query losses after inner steps 1..S at `meta_step`.

    Args:
        num_steps: S, the inner steps (≥ 1).
        meta_step: meta-steps already taken (0 at the first).
        anneal_steps: T, the meta-steps the multi-step loss lasts (annealed over them).

    Returns:
        None from meta-step T on, or where S is 1 (the last step's loss alone); else the
        weights, which sum to 1: `max(1/S - t/(S·T), 0.03/S)` for the first S - 1 steps
        and the rest for the last.
    """
    if num_steps <= 1 or meta_step >= anneal_steps:
        return None
    decay = 1.0 / num_steps / anneal_steps
    floor = MIN_STEP_WEIGHT / num_steps
    earlier = [max(1.0 / num_steps - meta_step * decay, floor)] * (num_steps - 1)
    return [*earlier, 1.0 - sum(earlier)]


class MetaStepCounter(nn.Module):
    """The meta-steps a learner has trained, as the 0-dim int64 buffer `count` (in the
    `state_dict`) with a host copy, so reading it needs no device sync."""

    def __init__(self) -> None:
        super().__init__()
        self.count: Tensor
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self._host: int | None = 0
        self.register_load_state_dict_post_hook(_forget_host_copy)

    @property
    def value(self) -> int:
        if self._host is None:  # loaded from a state_dict: read once
            self._host = int(self.count)
        return self._host

    def advance(self) -> None:
        self._host = self.value + 1
        self.count.fill_(self._host)


def _forget_host_copy(module: nn.Module, incompatible_keys: object) -> None:
    module._host = None  # type: ignore[assignment]


def weighted_step_losses(step_losses: list[Tensor], weights: list[float]) -> Tensor:
    """`Σ_i weights[i] · step_losses[i]`: per task `[B]` (or one task's scalar)."""
    total = step_losses[0] * weights[0]
    for loss, weight in zip(step_losses[1:], weights[1:], strict=True):
        total = total + loss * weight
    return total
