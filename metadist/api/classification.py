"""Classifying new examples with a few-shot classifier run (what `Run.classify` does).

Each example, in the store's columns and original units, is scaled with its own
statistics (per-entity scaling) or the store's, then cut to the run's window (its last L
rows) or linearly resampled to L rows, as the N-way sampler reads a series. The learner
adapts on the labelled examples and labels the others.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

from metadist.api.class_labels import class_labels
from metadist.api.history import Entity, NanRule, check_magnitude, scale_entity
from metadist.api.protocols import AdaptingLearner, StoreSchema
from metadist.batch import TaskSet
from metadist.tasks.inference import ClassifyWindows, classify_windows

# a list of `[T, C]` (or `[T]`) arrays of the store's C columns, or one `[M, T, C]` array
Examples: TypeAlias = np.ndarray | Sequence[npt.ArrayLike]


def classify(
    learner: AdaptingLearner,
    sampler: Any,
    store: StoreSchema,
    support_x: Examples,
    support_labels: Sequence[Hashable],
    query_x: Examples,
    steps: int | None,
    max_classes: int | None = None,
) -> np.ndarray:
    """`Run.classify` of a classifier run's parts (see there for the arguments).

    Returns:
        `[M]` object array of the predicted labels (values of `support_labels`).

    Raises:
        ValueError: a sampler without the classification protocol
            (`metadist.tasks.inference`), and what `Run.classify` lists.
    """
    labels = class_labels(support_labels)
    windows = classify_windows(sampler, len(store.column_names))
    rule = NanRule.of_store(store, "examples")
    support = classifier_inputs(windows, store, support_x, "support_x", rule)
    query = classifier_inputs(windows, store, query_x, "query_x", rule)
    if len(labels) != len(support):
        raise ValueError(
            f"support_labels has {len(labels)} labels for {len(support)} support examples"
        )
    classes = sorted(set(labels), key=str)  # no two print alike (`class_labels`)
    if len(classes) < 2:
        raise ValueError(f"classify needs at least two classes, got {classes}")
    if max_classes is not None and len(classes) > max_classes:
        raise ValueError(
            f"support_labels has {len(classes)} classes; this run's network has a row per "
            f"way and was trained {max_classes}-way, so it labels at most {max_classes} "
            "(a prototype learner, e.g. protonet or metabaseline, takes any number)"
        )
    rule.note()  # what the store's NaN rule filled, once classify goes on
    codes = torch.tensor([classes.index(label) for label in labels], dtype=torch.int64)
    learner.eval()
    device = next(learner.parameters()).device
    support_set = TaskSet(torch.from_numpy(support)[None].to(device), codes[None].to(device))
    with torch.no_grad():
        params = learner.adapt(support_set, steps=steps)
        logits = learner.predict(params, torch.from_numpy(query)[None].to(device))
    predicted = logits[0, :, : len(classes)].argmax(-1).cpu().numpy()
    return np.asarray([classes[i] for i in predicted], dtype=object)


def classifier_inputs(
    windows: ClassifyWindows,
    store: StoreSchema,
    examples: Examples,
    field: str,
    rule: NanRule | None = None,
) -> np.ndarray:
    """`[M, L, F]` float32 examples, scaled and cut (or resampled) as the sampler does.

    Args:
        examples: a list of `[T, C]` (or `[T]`) arrays of the store's C columns, or one
            `[M, T, C]` array.
        field: the argument's name, for the errors.
        rule: the store's NaN rule, applied to each example as ingest applied it to the
            store's series (default: the store's own; its note is the caller's).

    Raises:
        ValueError: no examples, an argument or example of another shape (saying the
            shapes taken), a wrong number of columns, a non-finite value the store's NaN
            rule does not allow (named by its example, column and row), a value beyond
            the store's scaling, or an example shorter than the run's window.
    """
    num_columns = len(store.column_names)
    if rule is None:
        rule = NanRule.of_store(store, "examples")
    items = _examples(examples, field, num_columns)
    columns = np.asarray(windows.input_columns, dtype=np.int64)
    if windows.lookback is None:
        raise ValueError("the run's sampler records no lookback: the rows of an example")
    length = windows.lookback
    out = []
    for i, item in enumerate(items):
        item = np.asarray(item, dtype=np.float64)
        if item.ndim == 1:
            item = item[:, None]
        if item.ndim != 2 or len(item) == 0:
            raise ValueError(
                f"{field}[{i}] has shape {item.shape}; an example is a [T] or [T, C] array of "
                f"at least one row ({accepted(field, num_columns)})"
            )
        if item.shape[1] != num_columns:
            raise ValueError(
                f"{field}[{i}] has {item.shape[1]} columns; the run's store has {num_columns} "
                f"({', '.join(store.column_names)})"
            )
        entity = Entity(str(i), np.arange(len(item)), item, source=f"{field}[{i}]")
        entity = rule.apply(entity)
        if len(entity.values) == 0:
            raise ValueError(
                f"{field}[{i}] has no row left once the store's --nan {rule.name} rule "
                "removes its non-finite rows"
            )
        check_magnitude(entity, list(store.column_names), store.scaler.kind)
        entity = scale_entity(store, entity)
        assert entity.scaled is not None
        scaled = entity.scaled[:, columns]
        if windows.z_normalise:  # the whole example, before it is resampled or cut
            std = scaled.std(axis=0)
            scaled = (scaled - scaled.mean(axis=0)) / np.where(std > 1e-8, std, 1.0)
        if windows.resample:
            scaled = resample(scaled, length)
        elif len(scaled) < length:
            raise ValueError(f"{field}[{i}] has {len(scaled)} rows; the run reads {length}")
        else:
            scaled = scaled[-length:]
        out.append(scaled)
    return np.ascontiguousarray(np.stack(out), dtype=np.float32)


def _examples(examples: Examples, field: str, num_columns: int) -> list[np.ndarray]:
    """The examples of `examples` (a list of them, or one `[N, T, C]` array).

    Raises:
        ValueError: none, or an array of another shape (one `[T]` series, a `[N, T]`
            array of a univariate store), saying the shapes taken.
    """
    taken = accepted(field, num_columns)
    if isinstance(examples, np.ndarray) and examples.dtype != object:
        shape = examples.shape
        # a 2-D array is one [T, C] example; [N, T] of a univariate store is not
        if examples.ndim not in (2, 3) or (examples.ndim == 2 and shape[1] != num_columns):
            hint = {1: " ([x] for one example x)"}
            if num_columns == 1:  # [N, T]: N series of the store's one column
                hint[2] = " (x[..., None] for N series x)"
            raise ValueError(
                f"{field} is one array of shape {shape}; {taken}{hint.get(examples.ndim, '')}"
            )
        items = list(examples if examples.ndim == 3 else examples[None])
    else:
        items = [_example(e, f"{field}[{i}]") for i, e in enumerate(examples)]
        if items and all(item.ndim == 0 for item in items):  # one [T] series as a list
            raise ValueError(
                f"{field} is one series of {len(items)} numbers; {taken} ([x] for one example x)"
            )
    if not items:
        raise ValueError(f"{field} is empty")
    return items


def accepted(field: str, num_columns: int) -> str:
    """What an argument of examples may be, for messages."""
    return (
        f"{field} takes a list of [T] or [T, C] arrays, or one [N, T, C] array, of the "
        f"store's C = {num_columns} column{'s' * (num_columns != 1)}"
    )


def _example(value: npt.ArrayLike, field: str) -> np.ndarray:
    """One example as a float array.

    Raises:
        ValueError: one that is not numbers of one shape (ragged rows, text), named.
    """
    try:
        return np.asarray(value, dtype=np.float64)
    except (ValueError, TypeError):
        raise ValueError(f"{field} is not an array of numbers of one shape") from None


def resample(series: np.ndarray, length: int) -> np.ndarray:
    """`series [n, F]` linearly resampled to `[length, F]` (as the N-way sampler does)."""
    n = len(series)
    position = np.arange(length, dtype=np.float64) / max(length - 1, 1) * (n - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    weight = (position - low)[:, None].astype(np.float32)
    return series[low] * (1 - weight) + series[high] * weight
