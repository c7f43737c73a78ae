"""The docstrings of the public API (the API reference is generated from them) agree
with the code: an `Args:` section names every parameter and no other, every exception
a public function raises itself is listed under `Raises:`, and an `Attributes:` section
names real attributes, one per entry."""

import ast
import dataclasses
import inspect
import logging
import re
import textwrap

import pytest

from tests._public_names import public_callables, public_names

griffe = pytest.importorskip("griffe")

# raised by design to be overridden, never by a call a user makes
_NOT_DOCUMENTED = {"NotImplementedError"}


def _sections(doc: str, kind: str) -> list:
    logging.disable(logging.CRITICAL)  # griffe's own warnings: the assertions say it
    try:
        parsed = griffe.Docstring(doc, parser="google").parse()
    finally:
        logging.disable(logging.NOTSET)
    return [s for s in parsed if s.kind.value == kind]


def _parameters(function) -> list[str]:
    """The parameter names as a docstring writes them (`*args`, `**keywords`)."""
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [
        stars.get(p.kind, "") + p.name
        for p in inspect.signature(function).parameters.values()
        if p.name not in ("self", "cls")
    ]


def _documented(doc: str) -> list[str] | None:
    """The names an `Args:` section documents ("a, b: ..." documents both), None
    without one."""
    sections = _sections(doc, "parameters")
    if not sections:
        return None
    return [n.strip() for s in sections for p in s.value for n in p.name.split(",")]


def _raised_here(function) -> set[str]:
    """Exception classes `function` raises in its own body (not in nested functions)."""
    source = textwrap.dedent(inspect.getsource(function))
    found: set[str] = set()
    stack = list(ast.iter_child_nodes(ast.parse(source).body[0]))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = getattr(raised, "id", getattr(raised, "attr", None))
            if name and name[0].isupper():
                found.add(name)
        stack += ast.iter_child_nodes(node)
    return found - _NOT_DOCUMENTED


CALLABLES = list(public_callables())
IDS = [where for where, _, _ in CALLABLES]


@pytest.mark.parametrize("where,function,doc", CALLABLES, ids=IDS)
def test_an_args_section_names_exactly_the_parameters(where, function, doc):
    documented = _documented(doc)
    if documented is None:
        return  # described in prose
    real = _parameters(function)
    bare = [name.lstrip("*") for name in real]
    unknown = [name for name in documented if name.lstrip("*") not in bare]
    missing = [
        name for name in real if name not in documented and name.lstrip("*") not in documented
    ]
    assert not unknown and not missing, (
        f"{where}: Args documents {unknown} that it does not take, and leaves out {missing}"
    )


@pytest.mark.parametrize("where,function,doc", CALLABLES, ids=IDS)
def test_the_errors_a_function_raises_are_under_raises(where, function, doc):
    if inspect.isclass(function):  # its construction: `__init__` and `__post_init__`
        bodies = [vars(function).get(name) for name in ("__init__", "__post_init__")]
    else:
        bodies = [function]
    raised = set()
    for body in bodies:
        # a dataclass's generated `__init__` has no source file (and raises nothing)
        if inspect.isfunction(body) and not body.__code__.co_filename.startswith("<"):
            raised |= _raised_here(body)
    listed = {str(r.annotation).split(".")[-1] for s in _sections(doc, "raises") for r in s.value}
    unlisted = raised - listed
    assert not unlisted, f"{where} raises {sorted(unlisted)}; its Raises lists {sorted(listed)}"


CLASSES = [(where, obj) for where, obj in public_names() if inspect.isclass(obj)]


@pytest.mark.parametrize("where,cls", CLASSES, ids=[where for where, _ in CLASSES])
def test_an_attributes_section_names_real_attributes_one_per_entry(where, cls):
    """griffe reads "a, b: ..." under `Attributes:` as one attribute named "a," (the
    reference would show it so): one entry per attribute; a dataclass's fields all."""
    doc = inspect.getdoc(cls) or ""
    names = [a.name for s in _sections(doc, "attributes") for a in s.value]
    if not names:
        return
    fields = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    unknown = [n for n in names if n not in fields and not hasattr(cls, n)]
    if not dataclasses.is_dataclass(cls):  # instance attributes: set in the constructor
        source = inspect.getsource(cls)
        unknown = [n for n in unknown if not re.search(rf"self\.{n}\b", source)]
    missing = [f for f in fields if f not in names]
    assert not unknown and not missing, (
        f"{where}: Attributes names {unknown}, which it does not have, and leaves out {missing}"
    )
