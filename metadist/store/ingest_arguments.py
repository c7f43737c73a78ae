"""The types of `metadist.ingest`'s arguments, checked before anything is read or written.

`metadist ingest` hands them over as its parser made them. From Python (`metadist.ingest`
in a notebook) a wrong type used to surface deep inside: a `TypeError` naming no argument
(`src=3`, `out=None`), an iteration over an int (`features=3`) or `int()`'s own message
(`memory_limit_mb="big"`). Each is one `ValueError` naming the argument.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from metadist.options import coerce

# argument -> the type it takes (the column lists are checked apart: `_check_names`)
_TYPES: dict[str, Any] = {
    "entity_col": str,
    "time_col": str,
    "stratum_col": str | None,
    "label_col": str | None,
    "scaling": str,
    "nan": str,
    "progress": bool | None,
}
_PATHS = ("src", "out")
_INTEGERS = ("min_length", "batch_size", "workers", "memory_limit_mb")  # workers: or None


def check_argument_types(arguments: Mapping[str, Any]) -> None:
    """Checks the type of each of `ingest`'s `arguments` (its keyword names).

    Raises:
        ValueError: an argument of another type, naming it (`memory_limit_mb must be an
            integer, got 'big'`; `src must be a path (str or pathlib.Path), not 3`).
    """
    for name in _PATHS:
        if not isinstance(arguments[name], (str, os.PathLike)):
            raise ValueError(
                f"{name} must be a path (str or pathlib.Path), not {arguments[name]!r}"
            )
    for name, hint in _TYPES.items():
        coerce(hint, arguments[name], name)
    for name in _INTEGERS:
        value = arguments[name]
        if not (value is None and name == "workers") and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral)
        ):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    for name in ("features", "targets"):
        _check_names(name, arguments[name])


def _check_names(name: str, value: Any) -> None:
    """A column list: one string (`"a,b"`, as the flag takes it) or any collection of
    strings (a list, a tuple, a pandas `Index` of `df.columns`)."""
    if isinstance(value, str):
        return
    listed = isinstance(value, Iterable) and (
        isinstance(value, Iterator) or all(isinstance(item, str) for item in value)
    )  # an iterator is read once, by ingest: its items are checked there
    if not listed:
        raise ValueError(f"{name} must be a list of column names, not {value!r}")
