"""The arguments of `metadist.load_run` and `metadist.fit`, checked before anything is read
or trained: a wrong type is one `ValueError` naming the argument (it was a `TypeError`
that named none, or a single string taken letter by letter)."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import Any


def run_path(name: str, value: Any) -> str | os.PathLike:
    """`value` where it is a path (`str` or `os.PathLike`).

    Raises:
        ValueError: another type, naming `name`.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a path (str or pathlib.Path), not {value!r}")
    return value


def run_paths(name: str, value: Any) -> list[str | os.PathLike] | None:
    """`value` as a list of paths: one path is a list of one; None stays None.

    Raises:
        ValueError: not a path or a sequence of paths, naming `name`.
    """
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return [value]
    if not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a list of run directories, not {value!r}")
    return [run_path(f"{name}[{index}]", item) for index, item in enumerate(value)]


def module_names(name: str, value: Any) -> Collection[str]:
    """`value` as a list of module names: one name is a list of one.

    Raises:
        ValueError: not a name or a collection of names, naming `name`.
    """
    if isinstance(value, str):
        return [value]
    if value is None:
        return []
    if not isinstance(value, Collection) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of module names, not {value!r}")
    return list(value)
