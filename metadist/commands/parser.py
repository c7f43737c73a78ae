"""The command line's argument parser: a mistake in the arguments is one line.

argparse answers a bad argument with the whole usage block (fifteen lines for
`metadist competition`) before the one line that says what is wrong. `Parser` prints
that line alone, with where the usage is, and exits with argparse's status 2.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose errors are one line (its subcommands' too), and
    which takes no abbreviated flags: `--nproc-per-nod=2` read as `--nproc-per-node`
    reached each rank unremoved, and every rank launched ranks of its own, without end."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}{self._meant(message)} (usage: {self.prog} --help)",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)

    def _meant(self, message: str) -> str:
        """`; did you mean --X?` for an unrecognized flag close to one of this parser's."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        flag = message[len(prefix) :].split()[0].split("=")[0]
        if not flag.startswith("--"):
            return ""
        close = difflib.get_close_matches(flag, list(self._option_string_actions), n=1)
        return f"; did you mean {close[0]}?" if close else ""
