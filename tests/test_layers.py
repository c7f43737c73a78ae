"""The package's layers run one way: a module imports only its own layer and those below.

The order is listed once, here (docs/design.md draws it). A module under `metadist/train/`
that imports `metadist.eval`, or a store module that imports `metadist.tasks`, fails this
test. Entry-point aliases (`python -m metadist.train`, `python -m metadist.eval`) are
shims that forward to the top floor and are the only exception, named below.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "metadist"

# Lowest first. The first entry is the package's foundation (plain modules under metadist/);
# every other name is a subpackage or top-level module.
LAYERS: list[tuple[str, ...]] = [
    (
        "batch",
        "configs",
        "diskspace",
        "options",
        "registry",
        "durable",
        "progress",
        "runlock",
        "__version__",
    ),
    ("store",),
    ("datasets",),
    ("tasks",),
    ("data",),
    ("models",),
    ("learners",),
    ("train",),
    ("eval",),
    ("launch",),
    ("commands", "cli", "demo", "api", "forecast", "__init__"),
]
# Shims whose only job is to forward an alias to the top floor.
ENTRY_POINT_SHIMS = {"metadist.train.__main__", "metadist.eval.__main__"}


def _layer(module: str) -> int:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    for index, names in enumerate(LAYERS):
        if name in names:
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out.append((".".join(parts), path))
    return out


def _imports(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "metadist":  # `from metadist import store` imports a module
                found += [(f"metadist.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((node.module, node.lineno))
    return [(name, line) for name, line in found if name.split(".")[0] == "metadist"]


@pytest.mark.parametrize("module,path", _modules(), ids=lambda v: str(v).split("/")[-1])
def test_no_module_imports_a_higher_layer(module, path):
    if module in ENTRY_POINT_SHIMS:
        return
    me = _layer(module.removesuffix(".__init__") if module != "metadist.__init__" else module)
    upward = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for name, line in _imports(path)
        if _layer(name) > me
    ]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The rule is not vacuous: a training module importing evaluation is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from metadist.eval.scoring import evaluate_tasks\nimport metadist.store\n")
    names = [name for name, _ in _imports(bad)]
    assert names == ["metadist.eval.scoring", "metadist.store"]
    assert _layer("metadist.eval.scoring") > _layer("metadist.train.loop")
    assert _layer("metadist.store") < _layer("metadist.train.loop")


def test_shims_only_forward():
    for module in ENTRY_POINT_SHIMS:
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        names = {name for name, _ in _imports(path)}
        assert names <= {"metadist.commands.train", "metadist.commands.evaluate"}, module
