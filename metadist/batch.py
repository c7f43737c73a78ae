"""The batch of tasks that flows from samplers through the loader into learners."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor


@dataclass
class TaskSet:
    """One side (support or query) of a batch of B tasks.

    Attributes:
        x: inputs. Forecasting `[B, K, L, F]`; classification `[B, N*K, L, F]`;
            regression (sinusoid) `[B, K, D]`.
        y: targets. Forecasting `[B, K, H, T]`; classification class indices `[B, N*K]`
            (int64, remapped to 0..N-1 per task); regression `[B, K, T]`.
    """

    x: Tensor
    y: Tensor


def check_support(support: object) -> None:
    """Refuses, in one line, a learner's `adapt` given anything but a support set (the
    habit of other libraries: `learner.adapt(loss)`).

    Raises:
        TypeError: `support` has no `x` and `y` (a `TaskSet`, as `batch.support` is).
    """
    if not (hasattr(support, "x") and hasattr(support, "y")):
        raise TypeError(
            "adapt(support): support is the support side of a batch (batch.support, a "
            f"TaskSet of x and y), not a {type(support).__name__}: the learners adapt on "
            "the support examples themselves, not on a loss"
        )


@dataclass
class MetaBatch:
    """B tasks, each with a support set (adapt on it) and a query set (score on it).

    `batch["train"]` and `batch["test"]` return `(inputs, targets)` of the support and
    query sets, as torchmeta's `BatchMetaDataLoader` did.

    Attributes:
        support: the support sets, `TaskSet` with a leading task dimension B.
        query: the query sets.
        entity_index: `[B]` int64, the store row of each task's entity (-1 without a store).
        stratum: `[B]` int64, the stratum code of each task (0 without strata).
        split_time: `[B]` int64, the split time tau of each forecast task (time units of
            the store; -1 where it does not apply).
    """

    support: TaskSet
    query: TaskSet
    entity_index: Tensor
    stratum: Tensor
    split_time: Tensor

    def __getitem__(self, key: str) -> tuple[Tensor, Tensor]:
        if key == "train":
            return self.support.x, self.support.y
        if key == "test":
            return self.query.x, self.query.y
        raise KeyError(f"MetaBatch has 'train' (support) and 'test' (query), not {key!r}")

    @property
    def num_tasks(self) -> int:
        return int(self.support.x.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MetaBatch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> MetaBatch:
        return self._map(lambda t: t.pin_memory())

    def select(self, index: slice | Tensor) -> MetaBatch:
        """The tasks at `index` (a slice or index tensor over B), as a new MetaBatch."""
        return self._map(lambda t: t[index])

    def _map(self, fn) -> MetaBatch:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, TaskSet):
                out[f.name] = TaskSet(fn(value.x), fn(value.y))
            else:
                out[f.name] = fn(value)
        return replace(self, **out)


def cat_batches(batches: list[MetaBatch]) -> MetaBatch:
    """Concatenates batches along the task dimension."""
    if not batches:
        raise ValueError("cat_batches needs at least one batch")

    def cat(get):
        return torch.cat([get(b) for b in batches], dim=0)

    return MetaBatch(
        support=TaskSet(cat(lambda b: b.support.x), cat(lambda b: b.support.y)),
        query=TaskSet(cat(lambda b: b.query.x), cat(lambda b: b.query.y)),
        entity_index=cat(lambda b: b.entity_index),
        stratum=cat(lambda b: b.stratum),
        split_time=cat(lambda b: b.split_time),
    )
