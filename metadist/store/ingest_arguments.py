"""The types of `metadist.ingest`'s arguments, checked before anything is read or written.

`metadist ingest` hands them over as its parser made them. From Python (`metadist.ingest`
in a notebook) a wrong type used to surface deep inside: a `TypeError` naming no argument
(`src=3`, `out=None`), an iteration over an int (`features=3`) or `int()`'s own message
(`memory_limit_mb="big"`). Each is one `ValueError` naming the argument.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from metadist.options import coerce

# argument -> the type it takes (`features="a,b"`, a string of names, is a Sequence[str])
_TYPES: dict[str, Any] = {
    "entity_col": str,
    "time_col": str,
    "features": Sequence[str],
    "targets": Sequence[str],
    "stratum_col": str | None,
    "label_col": str | None,
    "scaling": str,
    "nan": str,
    "min_length": int,
    "batch_size": int,
    "workers": int | None,
    "memory_limit_mb": int,
    "progress": bool | None,
}
_PATHS = ("src", "out")


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
