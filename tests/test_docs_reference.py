"""The API reference (docs/reference.md) documents every public name: `metadist.__all__`
and each subpackage's `__all__`. A function or class has a `::: module.name` entry that
is that very object (mkdocstrings renders it from its docstring); a constant is named
in the table of constants."""

import importlib
import inspect
import re

import pytest

from tests._public_names import ROOT, public_names

REFERENCE = (ROOT / "docs" / "reference.md").read_text()
ENTRIES = re.findall(r"^::: (\S+)", REFERENCE, re.M)


def _resolve(path: str):
    """The object `path` (`package.module.Name`) names, imported as mkdocstrings does."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for name in parts[end:]:
            found = getattr(found, name)
        return found
    raise ImportError(path)


@pytest.mark.parametrize("path", ENTRIES)
def test_every_reference_entry_names_an_object(path):
    _resolve(path)


def _is_documented_object(obj) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj)


DOCUMENTED = {id(_resolve(path)) for path in ENTRIES}
NAMES = public_names()


@pytest.mark.parametrize("where,obj", NAMES, ids=[where for where, _ in NAMES])
def test_every_public_name_is_in_the_reference(where, obj):
    if _is_documented_object(obj):
        assert id(obj) in DOCUMENTED, f"{where}: no `::: ...` entry in docs/reference.md"
        assert inspect.getdoc(obj), f"{where} has no docstring for the reference to show"
    else:
        assert f"`{where}`" in REFERENCE, f"{where}: not in docs/reference.md's constants"
