"""Every `benchmarks/*.py` command quoted in BENCHMARKS.md, docs/benchmarks.md and the
README names only options its script has (read from the script's own `--help`)."""

from __future__ import annotations

import re
import shlex

import pytest
from _benchmark_scripts import BENCHMARKS, run_script

ROOT = BENCHMARKS.parent
DOCS = ("BENCHMARKS.md", "docs/benchmarks.md", "README.md")
COMMAND = re.compile(r"(?:python\S*|^)\s*\S*benchmarks/(\w+)\.py((?:[^`\n]|\\\n)*)")


def quoted_commands() -> list[tuple[str, str, list[str]]]:
    """(where, script, its option names) of each quoted command that names an option."""
    found = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        for number, line in _joined(lines):
            for script, rest in COMMAND.findall(line):
                rest = re.sub(r"\{([^}|]*)\|[^}]*\}", r"\1", rest).replace("[", " ")
                words = shlex.split(rest.split(")")[0] if "(cd" in line else rest, True)
                options = [
                    w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][\w-]*(=.*)?", w)
                ]
                if options:
                    found.append((f"{doc}:{number}", script, options))
    return found


def _joined(lines: list[str]):
    """(line number, line) with a shell continuation (`\\` at the end) joined to the next."""
    number = 0
    while number < len(lines):
        start, line = number + 1, lines[number]
        while line.endswith("\\") and number + 1 < len(lines):
            number += 1
            line = line[:-1] + " " + lines[number]
        number += 1
        yield start, line


def test_the_docs_quote_commands():
    assert len(quoted_commands()) > 50


@pytest.mark.parametrize(
    ("where", "script", "options"), quoted_commands(), ids=lambda v: str(v)[:30]
)
def test_a_quoted_command_names_options_its_script_has(where, script, options, monkeypatch):
    assert (BENCHMARKS / f"{script}.py").is_file(), f"{where}: no benchmarks/{script}.py"
    if script == "m3":  # its options are `metadist competition`'s
        _, help_text, _ = run_script("m3", ["--help"], monkeypatch)
        from metadist.commands.competition.cli import build_parser

        help_text += build_parser().format_help()
    else:
        status, help_text, _ = run_script(script, ["--help"], monkeypatch)
        assert status == 0
    known = set(re.findall(r"--[a-z][\w-]*", help_text))
    assert not set(options) - known, f"{where}: {script}.py has no {set(options) - known}"
