"""A sampler's first batch, drawn before training and checked against what the learners
take of a `MetaBatch`: a sampler of one's own that returns something else, or fails, is
refused in one line naming it and what is wrong, not by a traceback from deep in a model."""

from __future__ import annotations

import numpy as np
import torch

from metadist.batch import MetaBatch, TaskSet
from metadist.tasks.base import TaskSampler, derive_task_seeds
from metadist.user_code import user_code_location

FIRST_BATCH_TASKS = 2  # two, so that a sampler that ignores the units it is given shows it


def first_batch(sampler: TaskSampler, name: str, seed: int) -> MetaBatch:
    """Tasks 0 and 1 of epoch 0 of unit 0, checked (`check_meta_batch`).

    Raises:
        ValueError: the sampler failed (its own `ValueError` is passed on, with where in
            the user's code it was raised), or its batch is not one the learners take.
    """
    units = np.zeros(FIRST_BATCH_TASKS, dtype=np.int64)
    positions = np.arange(FIRST_BATCH_TASKS)
    try:
        batch = sampler.sample(units, derive_task_seeds(seed, 0, positions))
    except Exception as error:  # noqa: BLE001 - the user's sampler, whatever it raised
        where = user_code_location(error, installed=False)
        if isinstance(error, ValueError) and not where:
            raise  # metadist's own sampler refusing its options: already one line
        raise ValueError(
            f"sampler {name!r} failed on a first batch of {FIRST_BATCH_TASKS} tasks: "
            f"{type(error).__name__}: {error}{where}"
        ) from None
    check_meta_batch(batch, FIRST_BATCH_TASKS, name)
    return batch


def check_meta_batch(batch: object, num_tasks: int, name: str) -> None:
    """Raises a one-line `ValueError` where `batch` (the sampler `name`'s, for `num_tasks`
    units) is not a `MetaBatch` the learners take: tensors with a leading task dimension
    of `num_tasks`, float32 inputs, float32 or int64 targets with one per input, and one
    input (and target) shape for support and query."""
    what = f"sampler {name!r}: sample()"
    if not isinstance(batch, MetaBatch):
        raise ValueError(f"{what} returned {type(batch).__name__}, not a metadist.MetaBatch")
    for side in ("support", "query"):
        part = getattr(batch, side)
        if not isinstance(part, TaskSet):
            raise ValueError(f"{what}.{side} is {type(part).__name__}, not a metadist.TaskSet")
        for field in ("x", "y"):
            _check_tasks(getattr(part, field), f"{what}.{side}.{field}", num_tasks)
        _check_dtypes(part, f"{what}.{side}")
        if part.x.ndim < 2 or part.y.ndim < 2 or part.x.shape[1] != part.y.shape[1]:
            raise ValueError(
                f"{what}.{side}: x {tuple(part.x.shape)} and y {tuple(part.y.shape)} must be "
                "[B, K, ...] with one target per input"
            )
    for field in ("x", "y"):
        support, query = getattr(batch.support, field), getattr(batch.query, field)
        if support.shape[2:] != query.shape[2:] or support.dtype != query.dtype:
            raise ValueError(
                f"{what}: support.{field} {tuple(support.shape)} {support.dtype} and query."
                f"{field} {tuple(query.shape)} {query.dtype} differ past [B, K]: one model "
                "reads both"
            )
    for field in ("entity_index", "stratum", "split_time"):
        value = getattr(batch, field)
        _check_tasks(value, f"{what}.{field}", num_tasks)
        if value.ndim != 1:
            raise ValueError(f"{what}.{field} has shape {tuple(value.shape)}; it is [B]")


def check_batch_dtypes(batch: MetaBatch, name: str, when: str) -> None:
    """Raises a one-line `ValueError` where a batch after the first (`when`: "at
    meta-step 7", "in meta-val") has inputs or targets of a dtype the models do not take:
    a sampler whose dtype depends on its units (padding that makes short series float64,
    say) passes the first batch's check and would fail in the model with a traceback.
    Cheap enough for every batch: the dtypes only."""
    what = f"sampler {name!r}: sample() {when}"
    _check_dtypes(batch.support, f"{what}: support")
    _check_dtypes(batch.query, f"{what}: query")


def _check_dtypes(part: TaskSet, what: str) -> None:
    if part.x.dtype != torch.float32:
        raise ValueError(f"{what}.x is {part.x.dtype}; the models take torch.float32")
    if part.y.dtype not in (torch.float32, torch.int64):
        raise ValueError(
            f"{what}.y is {part.y.dtype}; targets are torch.float32 (forecasting, "
            "regression) or torch.int64 class indices"
        )


def _check_tasks(value: object, what: str, num_tasks: int) -> None:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{what} is {type(value).__name__}, not a torch.Tensor")
    if value.ndim == 0 or value.shape[0] != num_tasks:
        raise ValueError(
            f"{what} has shape {tuple(value.shape)}: its first dimension is the batch's "
            f"tasks, {num_tasks} for the {num_tasks} units asked"
        )


def example_shapes(
    example: MetaBatch, sampler: TaskSampler
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`(input_shape, output_shape)` of one example of the sampler's tasks.

    Regression and forecasting: `x [B, K, *input_shape]`, `y [B, K, *output_shape]`.
    Classification (integer targets `[B, N*K]`): the output is one logit per class, N
    taken from the sampler's `num_ways`.
    """
    input_shape = tuple(example.support.x.shape[2:])
    target = example.support.y
    if target.dtype == torch.int64:  # class indices (`check_meta_batch` takes no other)
        num_ways = getattr(sampler, "num_ways", None)
        if num_ways is None:
            num_ways = int(target.max()) + 1
        return input_shape, (int(num_ways),)
    return input_shape, tuple(target.shape[2:])
