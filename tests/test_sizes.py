"""One idea per file, in the open: no module over 500 lines, at most three functions over
80 lines (each named in docs/design.md), and at most twelve function-local imports of the
package's own modules (the rest at module top, where the layers test sees them)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "metadist"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_LONG_FUNCTIONS = 3
MAX_LOCAL_IMPORTS = 12


def _files(package: Path = PACKAGE) -> list[Path]:
    return sorted(package.rglob("*.py"))


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def _local_imports(path: Path) -> list[str]:
    found = []
    for function in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] if node.level == 0 else [f".{node.module}"]
            if any(n.split(".")[0] == "metadist" or n.startswith(".") for n in names):
                found.append(f"{path.name}:{node.lineno} {names}")
    return found


def test_no_module_is_over_500_lines():
    over = [
        f"{p.relative_to(PACKAGE.parent)}: {n} lines"
        for p in _files()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert not over, "split these modules by idea:\n" + "\n".join(over)


def test_at_most_three_functions_over_80_lines():
    long = [entry for path in _files() for entry in _long_functions(path)]
    assert len(long) <= MAX_LONG_FUNCTIONS, "functions over 80 lines:\n" + "\n".join(long)


def test_at_most_twelve_function_local_imports_of_the_package():
    local = [entry for path in _files() for entry in _local_imports(path)]
    assert len(local) <= MAX_LOCAL_IMPORTS, "imports inside functions:\n" + "\n".join(local)


def test_the_checks_see_what_they_count(tmp_path):
    source = tmp_path / "bad.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    source.write_text(
        f"def long():\n{body}\n\n\ndef lazy():\n    from metadist import api\n    return api\n"
    )
    assert len(_long_functions(source)) == 1
    assert len(_local_imports(source)) == 1


def test_every_module_is_on_the_map():
    """docs/design.md names every module of the package (its file's name, in its
    package's line of the map or the table), so a new room is never off the map."""
    import re

    words = set(re.findall(r"\w+", (PACKAGE.parent / "docs" / "design.md").read_text()))
    missing = [
        str(path.relative_to(PACKAGE))
        for path in _files()
        if not path.stem.startswith("__") and path.stem not in words
    ]
    assert not missing, f"add these modules to docs/design.md's map: {missing}"
