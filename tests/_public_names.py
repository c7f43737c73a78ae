"""The public names of metadist: `metadist.__all__` and each subpackage's `__all__`."""

import importlib
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def public_packages() -> list[str]:
    """`metadist` and every subpackage of it that declares `__all__`."""
    names = ["metadist"]
    for init in sorted((ROOT / "metadist").glob("*/__init__.py")):
        name = f"metadist.{init.parent.name}"
        if hasattr(importlib.import_module(name), "__all__"):
            names.append(name)
    return names


def public_names() -> list[tuple[str, Any]]:
    """`(package.name, object)` of every public name, in `__all__` order."""
    found = []
    for package in public_packages():
        module = importlib.import_module(package)
        found += [(f"{package}.{name}", getattr(module, name)) for name in module.__all__]
    return found


def public_callables() -> Iterator[tuple[str, Callable[..., Any], str]]:
    """`(where, function, docstring)` of every public function, every public class's
    construction (its class docstring and `__init__`'s) and its public methods, once
    each."""
    seen: set[int] = set()
    for where, obj in public_names():
        if (
            id(obj) in seen
            or not callable(obj)
            or not getattr(obj, "__module__", "").startswith("metadist")
        ):
            continue
        seen.add(id(obj))
        if not inspect.isclass(obj):
            yield where, obj, inspect.getdoc(obj) or ""
            continue
        if any("__init__" in k.__dict__ for k in obj.__mro__[:-1]):
            init_doc = obj.__init__.__doc__ if "__init__" in obj.__dict__ else ""
            yield where, obj, f"{inspect.getdoc(obj)}\n\n{inspect.cleandoc(init_doc or '')}"
        for name, member in vars(obj).items():
            function = getattr(member, "__func__", member)
            if not name.startswith("_") and inspect.isfunction(function):
                yield f"{where}.{name}", function, inspect.getdoc(function) or ""
