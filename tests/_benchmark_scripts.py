"""Running a script of benchmarks/ in the test process: its `main`, its exit status and
what it printed."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def script_module(name: str):
    """benchmarks/NAME.py, imported afresh."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name: str, args: list[str], monkeypatch) -> tuple[object, str, str]:
    """Runs benchmarks/NAME.py's main with `args`: (exit status, stdout, stderr); a
    `SystemExit("message")` is printed and counted as status 1, as the interpreter does."""
    module = script_module(name)
    monkeypatch.setattr(sys, "argv", [f"benchmarks/{name}.py", *args])
    out, err = io.StringIO(), io.StringIO()
    status: object = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            takes_argv = bool(inspect.signature(module.main).parameters)
            status = module.main(args) if takes_argv else module.main()
        except SystemExit as stop:
            status = stop.code
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
                status = 1
    return status, out.getvalue(), err.getvalue()
