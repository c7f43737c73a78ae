"""`python -m metadist.eval`: alias of `metadist eval`.

An entry-point shim: the command lives on the top floor (`metadist.commands.evaluate`).
"""

import sys

from metadist.commands.evaluate import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main(prog="python -m metadist.eval"))
