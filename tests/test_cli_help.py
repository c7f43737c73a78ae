"""Every command's `--help` reads whole: each option and argument says what it is (the
demo's `--meta-steps` and `--seed`, ingest's `--scaling` and `--nan`, synth's
`--time-kind` were bare names), and no example of an epilog is two lines run together (a
backslash at a line's end in the source joined eval's M3 example into one line with a
gap of spaces)."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

from metadist.cli import COMMANDS, build_parser


def _parsers(command: str):
    """(name, parser) of the command and of each of its subcommands."""
    module = importlib.import_module(COMMANDS[command])
    if hasattr(module, "register_cli"):
        top = build_parser(command, module)
        (sub,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[command]
    else:  # a workflow with a parser of its own
        parser = module.build_parser()
    found = [(f"metadist {command}", parser)]
    for name, each in found:
        for action in each._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [(f"{name} {n}", p) for n, p in action.choices.items()]
    return found


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_says_what_it_is(command):
    for name, parser in _parsers(command):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_example_runs_two_lines_together(command):
    for name, parser in _parsers(command):
        for line in (parser.epilog or "").splitlines():
            # a gap of spaces inside a line, other than before an aligned `# comment`
            assert not re.search(r"\S {4,}[^ #]", line), f"{name}: {line!r}"


def test_train_help_names_the_configs_shipped_in_the_package():
    epilog = " ".join(_parsers("train")[0][1].epilog.split())
    assert "shipped inside the installed package" in epilog
