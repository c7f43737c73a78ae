"""Whether a sampler can reach the loader's worker processes, checked before they start.

A worker started by `spawn` or `forkserver` (macOS's and Windows' default, and Linux's
from Python 3.14) receives the sampler pickled and imports its class again. A class
defined in a script under `if __name__ == "__main__":`, in an interactive session, or
inside a function cannot be found there: each worker then dies with its own traceback
and the loader raises "DataLoader worker (pid(s) ...) exited unexpectedly". Checked
here, it is one `ValueError` naming the sampler, the reason and the remedies.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import pickle
import sys
from typing import Any

from metadist.tasks.base import TaskSampler
from metadist.tasks.naming import sampler_label

_REMEDY = "or use num_workers=0 or multiprocessing_context='fork'"


def start_method(context: Any) -> str:
    """The start method of the workers torch starts with `multiprocessing_context`
    (a method name, a context, or None for the default), without fixing the default."""
    if isinstance(context, str):
        return context
    if context is not None:
        return str(context.get_start_method())
    chosen = multiprocessing.get_start_method(allow_none=True)
    return chosen or multiprocessing.get_all_start_methods()[0]


def check_sampler_reaches_workers(sampler: TaskSampler, num_workers: int, context: Any) -> None:
    """Raises one `ValueError` where workers that `context` starts could not rebuild
    `sampler` (nothing to check with no workers, or with `fork`, which copies it).

    Raises:
        ValueError: the sampler's class is defined in `__main__` where a new process does
            not define it, or inside a function, or the sampler does not pickle.
    """
    if num_workers <= 0:
        return
    method = start_method(context)
    if method == "fork":
        return
    cls = type(sampler)
    prefix = f"{sampler_label(sampler)} cannot reach loader workers started by {method!r}"
    for klass in cls.__mro__:
        reason = _unreachable(klass)
        if reason:
            raise ValueError(f"{prefix}: {reason}; {_REMEDY}")
    try:
        pickle.dumps(sampler)
    except Exception as error:  # noqa: BLE001 - whatever the user's attributes raise
        said = " ".join(str(error).split())
        raise ValueError(
            f"{prefix}: it does not pickle ({type(error).__name__}: {said}): keep "
            f"attributes a new process can rebuild; {_REMEDY}"
        ) from None


def _unreachable(klass: type) -> str | None:
    """Why a new process could not import `klass`, or None."""
    if "<locals>" in klass.__qualname__:
        return (
            f"class {klass.__qualname__} is defined inside a function; define it at the top "
            "level of a module"
        )
    if klass.__module__ != "__main__":
        return None
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is None or not os.path.isfile(path):  # a REPL, a notebook, python - or -c
        return (
            f"class {klass.__name__} is defined in an interactive session (no script file "
            "for a new process to run); define it in a module and import it"
        )
    if _under_main_guard(path, klass.__name__):
        return (
            f'class {klass.__name__} is defined under `if __name__ == "__main__":` of {path}, '
            "which a new process does not run; define it at the top level of the script"
        )
    return None


def _under_main_guard(path: str, class_name: str) -> bool:
    """Whether `path` defines `class_name` only inside an `if` testing `__name__`."""
    try:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read(), path)
    except (OSError, SyntaxError, ValueError):
        return False  # not readable as Python: let the worker say what it finds
    guarded = False
    for statement in tree.body:
        if not _defines(statement, class_name):
            continue
        if not (isinstance(statement, ast.If) and _tests_name(statement.test)):
            return False  # defined where the script's top level runs it
        if any(_defines(branch, class_name) for branch in statement.orelse):
            return False  # the else branch is what a new process runs
        guarded = True
    return guarded


def _defines(statement: ast.stmt, class_name: str) -> bool:
    return any(
        isinstance(node, ast.ClassDef) and node.name == class_name for node in ast.walk(statement)
    )


def _tests_name(test: ast.expr) -> bool:
    return any(isinstance(node, ast.Name) and node.id == "__name__" for node in ast.walk(test))
