"""Importing a run's `imports`: the modules that register its samplers, learners or models."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Collection

from metadist.user_code import user_code_location


def import_modules(names: list[str], allowed: Collection[str] | None = None) -> None:
    """Imports the `imports` modules (which register samplers, learners or models).

    The working directory is put on `sys.path` first, so that a module next to the
    command (`my_samplers.py`) is found on every rank and by `metadist.eval`.

    A run received from someone else is data, not code: with `allowed` given (loading a
    run), a module is imported only when it is in `allowed` or already imported (which
    runs no code), so a run's `imports` never run a file beside it unasked.

    Raises:
        ValueError: a module cannot be imported, or is not allowed; the message names it,
            and for the latter how to allow it.
    """
    if not names:
        return
    if allowed is not None:
        refused = [n for n in names if n not in allowed and n not in sys.modules]
        if refused:
            flags = " ".join(f"--allow-import {n}" for n in refused)
            raise ValueError(
                f"imports: the run imports module(s) {', '.join(map(repr, refused))}, code "
                "that would run on loading it; a loaded run imports nothing unless you allow "
                f"it: {flags} (load_run(..., allow_imports=[...]) in Python)"
            )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    for name in names:
        if name.endswith(".py") and os.path.isfile(os.path.join(cwd, name)):
            raise ValueError(
                f"imports: {name!r} is a file; name the module, without .py: {name[:-3]!r}"
            )
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            if (
                error.name is not None
                and error.name != name
                and not name.startswith(f"{error.name}.")
            ):  # the module was found; something it imports was not
                raise ValueError(
                    f"imports: module {name!r} was found but its import failed: {error}"
                    f"{user_code_location(error)}"
                ) from None
            raise ValueError(
                f"imports: no module {name!r}; it must be importable from the working "
                f"directory {cwd} or PYTHONPATH"
            ) from None
        except Exception as error:  # noqa: BLE001 - any failure inside the user module
            raise ValueError(
                f"imports: module {name!r} failed on import: {type(error).__name__}: {error}"
                f"{user_code_location(error)}"
            ) from None
