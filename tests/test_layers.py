"""The package's layers run one way: a module imports only its own layer and those below.

The order is listed once, here (docs/design.md draws it). A module under `metadist/train/`
that imports `metadist.eval`, or a store module that imports `metadist.tasks`, fails this
test. Entry-point aliases (`python -m metadist.train`, `python -m metadist.eval`) are
shims that forward to the top floor and are the only exception, named below.

Within a layer, modules import each other without a cycle: no module's import-time
imports lead back to itself (`test_no_import_cycles`).
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
        "user_code",
        "natural_order",
        "stop_signals",
        "rank_message",
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


def _modules(package: Path = PACKAGE) -> list[tuple[str, Path]]:
    out = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
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


# ------------------------------------------------------------------------- import cycles


def _import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports when it is imported itself.

    A package is named without `.__init__`. Only module-level imports count (also inside a
    module-level `if` or `try`, but not under `if TYPE_CHECKING:`); an import inside a
    function runs later and cannot take part in an import-time cycle. `from a.b import c`
    imports the module `a.b.c` where there is one (a submodule), else `a.b`.
    """
    modules = {name.removesuffix(".__init__"): path for name, path in _modules(package)}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in _import_time_imports(ast.parse(path.read_text(), str(path)).body, modules):
            while name and name not in modules:  # `import a.b.c` of a name, not a module
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def _import_time_imports(body: list[ast.stmt], modules: dict[str, Path]) -> list[str]:
    found: list[str] = []
    for node in body:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append(submodule if submodule in modules else node.module)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            found += _import_time_imports(node.body + node.orelse, modules)
        elif isinstance(node, ast.Try):
            handlers = [stmt for handler in node.handlers for stmt in handler.body]
            found += _import_time_imports(node.body + handlers + node.orelse, modules)
    return found


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as its modules in order, the first repeated at the end
    (`[a, b, a]`), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        pending = [iter(sorted(graph[start]))]
        while pending:
            following = next(pending[-1], None)
            if following is None:  # every import of path[-1] explored: no cycle through it
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                pending.pop()
                continue
            if following in on_path:
                return path[path.index(following) :] + [following]
            if following not in done:
                path.append(following)
                on_path.add(following)
                pending.append(iter(sorted(graph[following])))
    return None


def test_no_import_cycles():
    cycle = _find_cycle(_import_graph())
    assert cycle is None, "import cycle among metadist modules: " + " -> ".join(cycle or [])


def test_the_check_sees_an_import_cycle(tmp_path):
    """The rule is not vacuous: a planted cycle is found and named; a function-local
    import, `TYPE_CHECKING` imports and `from a import submodule` are read as Python runs
    them."""
    package = tmp_path / "metadist"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from metadist.sub import leaf\n")
    (package / "sub" / "leaf.py").write_text("import metadist.b\n")
    (package / "a.py").write_text("from metadist.b import thing\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import metadist.other\n"
        "def later():\n    import metadist.other\n"
        "thing = 1\n"
    )
    (package / "other.py").write_text("from metadist import sub\n")
    graph = _import_graph(package)
    assert graph["metadist.b"] == set()
    assert graph["metadist.sub"] == {"metadist.sub.leaf"}
    assert graph["metadist.other"] == {"metadist.sub"}
    assert _find_cycle(graph) is None
    (package / "b.py").write_text("thing = 1\nfrom metadist.other import x\n")
    (package / "other.py").write_text("import metadist.a\n")
    assert _find_cycle(_import_graph(package)) == [
        "metadist.a",
        "metadist.b",
        "metadist.other",
        "metadist.a",
    ]
