"""`python -m metadist.train` and `metadist-train`: aliases of `metadist train`.

An entry-point shim: the command lives on the top floor (`metadist.commands.train`), which
may use evaluation; nothing else under `metadist.train` imports upwards.
"""

import sys

from metadist.commands.train import build_parser, main

__all__ = ["build_parser", "main"]


def alias_main() -> int:
    """The `metadist-train` console script."""
    return main(prog="metadist-train")


if __name__ == "__main__":
    sys.exit(main(prog="metadist-train"))
