"""`metadist` command line: one subcommand per module, each registered by that module.

A module listed in `_COMMAND_MODULES` defines `register_cli(subparsers)`, which adds its
parser(s) with `set_defaults(func=callable(args) -> int)`. Optional dependencies are
imported inside the command functions, so `metadist --help` works without extras.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from metadist.diskspace import OutOfSpaceError

_COMMAND_MODULES = [
    "metadist.datasets.synthetic",  # metadist synth
    "metadist.store.ingest",  # metadist ingest
    "metadist.store.verify",  # metadist verify
    "metadist.datasets.cli",  # metadist datasets m3
    "metadist.launch.slurm",  # metadist slurm submit
    "metadist.launch.sweep",  # metadist sweep
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metadist", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:  # command not built yet in this checkout
                continue
            raise
        module.register_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError, OutOfSpaceError) as error:
        print(f"metadist {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"metadist {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
