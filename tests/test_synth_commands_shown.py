"""Every `metadist synth` command the project shows a user runs as written: the shipped
experiments' summaries (`metadist experiments list`), the configs' comments and the
message of a missing `data.store` give its required `--entities`/`--length-range`
(`metadist synth data/synthetic/panel` alone stops at the parser)."""

import re
import shlex
from pathlib import Path

import pytest

from metadist.cli import build_parser
from metadist.commands import synth
from metadist.configs import find_experiments_dir, list_experiments
from metadist.train.config import DataConfig

ROOT = Path(__file__).resolve().parents[1]

# a command ends at a clause: a comma, a semicolon, `&&`, a closing bracket or backquote
_COMMAND = re.compile(r"metadist synth [^,;&)`\n]*")


def _commands(text: str) -> list[str]:
    return [match.group(0).strip() for match in _COMMAND.finditer(text)]


def _shown() -> list[tuple[str, str]]:
    shown = []
    for experiment in list_experiments(find_experiments_dir()):
        shown += [(f"summary of {experiment.name}", c) for c in _commands(experiment.summary)]
    for path in sorted((ROOT / "experiments").rglob("*.yaml")):
        comments = " ".join(
            line.lstrip("# ").strip()
            for line in path.read_text().splitlines()
            if line.startswith("#")
        )
        shown += [(str(path.relative_to(ROOT)), c) for c in _commands(comments)]
    with pytest.raises(FileNotFoundError) as missing:
        DataConfig(store="no/such/store").validate()
    shown += [("data.store message", c) for c in _commands(str(missing.value))]
    return shown


def test_the_synth_commands_are_found():
    where = {w for w, _ in _shown()}
    assert "summary of synthetic_maml" in where and "data.store message" in where


@pytest.mark.parametrize("where,command", _shown(), ids=[w for w, _ in _shown()])
def test_a_shown_synth_command_parses(where, command):
    parser = build_parser("synth", synth)
    try:
        args = parser.parse_args(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"{where}: `{command}` does not parse")
    assert args.entities is not None and args.length_range is not None
