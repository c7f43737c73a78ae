"""The labels of `Run.classify`'s support examples, checked: each names one class, and
no two classes print alike (the predictions are those labels, so `1` and `"1"` could not
be told apart in them, and `1` and `True`, being equal, would be one class printed two
ways)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any


def class_labels(support_labels: Sequence[Hashable]) -> list[Hashable]:
    """The labels of `support_labels` (one per support example), checked.

    Raises:
        ValueError: one string given for the labels, a label that is unhashable or names
            no class (NaN, equal to nothing, itself included), or two labels that print
            alike but differ or are equal but print differently: one line naming
            `support_labels`.
    """
    if isinstance(support_labels, (str, bytes)):
        raise ValueError(
            f"support_labels is one string ({support_labels!r}); give one label per support "
            "example, e.g. a list"
        )
    labels = list(support_labels)
    printed: dict[str, Hashable] = {}  # the first label of each printed form
    classes: dict[Hashable, Hashable] = {}  # the first label of each class
    for index, label in enumerate(labels):
        try:
            hash(label)
        except TypeError:  # a list or an array: it cannot name a class
            raise ValueError(
                f"support_labels[{index}] is a {type(label).__name__} ({label!r}); a label "
                "must be hashable: a str, an int, a tuple ..."
            ) from None
        if not _equal(label, label):
            raise ValueError(
                f"support_labels[{index}] is {label!r}, which names no class (it equals no "
                "label, itself included); give that example a label or leave it out"
            )
        first = printed.setdefault(str(label), label)
        if not _equal(first, label):
            raise ValueError(
                f"support_labels holds {_typed(first)} and {_typed(label)}, which print "
                "alike but are different classes: the predicted labels could not be told "
                "apart; give labels of one type"
            )
        first = classes.setdefault(label, label)
        if str(first) != str(label):
            raise ValueError(
                f"support_labels holds {_typed(first)} and {_typed(label)}, which are equal, "
                "so one class printed two ways: give labels of one type"
            )
    return labels


def _equal(a: Any, b: Any) -> bool:
    """`a == b`, False where the comparison has no truth value (pandas' NA)."""
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _typed(label: Any) -> str:
    return f"{label!r} ({type(label).__name__})"
