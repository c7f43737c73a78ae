"""The command line's argument parser: a mistake in the arguments is one line.

argparse answers a bad argument with the whole usage block (fifteen lines for
`metadist competition`) before the one line that says what is wrong. `Parser` prints
that line alone, with where the usage is, and exits with argparse's status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose errors are one line (its subcommands' too)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (usage: {self.prog} --help)", file=sys.stderr)
        sys.exit(2)
