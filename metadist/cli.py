"""`metadist` command line: one subcommand per module, each registered by that module.

A module named in `_COMMAND_MODULES` defines `register_cli(subparsers)`, which adds its
parser(s) with `set_defaults(func=callable(args) -> int)`. The workflow commands in
`_WORKFLOWS` (`metadist train`, `eval`, `demo`) own their whole argument list (Hydra
overrides, their own `--help`): everything after the command name goes to their `main`.
Optional dependencies are imported inside the command functions, so `metadist --help`
works without extras.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from metadist.diskspace import OutOfSpaceError

# name -> (module with `main(argv, prog=...)`, one-line help)
_WORKFLOWS = {
    "train": ("metadist.commands.train", "meta-train an experiment, then evaluate it"),
    "eval": ("metadist.commands.evaluate", "evaluate a training run on its held-out tasks"),
    "demo": ("metadist.demo", "the end-to-end demo: panel, store, training, evaluation"),
    "competition": (
        "metadist.commands.competition",
        "a forecasting competition's whole protocol on a long-format data set",
    ),
}

# command -> the module whose `register_cli` adds it. Only the module of the command
# being run is imported (`metadist ingest` loads neither torch nor the learners).
_COMMAND_MODULES = {
    "synth": "metadist.datasets.synthetic.cli",
    "ingest": "metadist.commands.ingest",
    "verify": "metadist.commands.verify",
    "datasets": "metadist.datasets.cli",
    "slurm": "metadist.launch.slurm",
    "sweep": "metadist.launch.sweep",
    "forecast": "metadist.commands.forecast",
    "experiments": "metadist.commands.experiments",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or (`command` given) only that command's parser and
    the names of the others."""
    from metadist import __version__

    parser = argparse.ArgumentParser(
        prog="metadist", description="metadist: meta-learning across many related time series."
    )
    parser.add_argument("--version", action="version", version=f"metadist {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in _WORKFLOWS.items():
        subparsers.add_parser(name, help=help_text, add_help=False)
    for name, module_name in _COMMAND_MODULES.items():
        if command is not None and name != command:
            subparsers.add_parser(name, add_help=False)
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name == module_name:  # command not built yet in this checkout
                continue
            raise
        module.register_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _WORKFLOWS:
        module = importlib.import_module(_WORKFLOWS[argv[0]][0])
        return int(module.main(argv[1:], prog=f"metadist {argv[0]}") or 0)
    parser = build_parser(argv[0] if argv and argv[0] in _COMMAND_MODULES else None)
    args, extra = parser.parse_known_args(argv)
    if extra:
        print(_unrecognized(parser, args, extra), file=sys.stderr)
        return 2
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


def _unrecognized(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]
) -> str:
    """One line for arguments no parser took, with the closest flag of the command."""
    from metadist.options import closest

    command = getattr(args, "command", None)
    flags: list[str] = []
    for action in parser._actions:  # the subcommand's own parser holds its flags
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            flags = list(action.choices[command]._option_string_actions)
    prog = f"metadist {command}" if command else "metadist"
    first = extra[0]
    guess = closest(first.split("=")[0], flags) if first.startswith("-") else None
    hint = f"; did you mean {guess}?" if guess else ""
    return f"{prog}: error: unrecognized argument {first}{hint} (see {prog} --help)"


if __name__ == "__main__":
    sys.exit(main())
