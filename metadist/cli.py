"""`metadist` command line: one subcommand per module, found in one dispatch table.

`COMMANDS` names the module of every command, one line each. Only the module of the
command being run is imported, so `metadist --help` and `metadist --version` load no
command module (nor torch), and a command module may import everything it needs at its
top. A command module is one of two kinds:

- it defines `register_cli(subparsers)`, which adds its parser(s) with
  `set_defaults(func=callable(args) -> int)`; this module parses the arguments and turns
  `ValueError`, `FileNotFoundError`, … into one line `metadist COMMAND: error: …`, as
  it does an error of any type raised in the user's own code (a sampler or model of
  theirs that `metadist forecast` runs: `user_code.user_error_line`);
- or it is a workflow (`metadist train`, `eval`, `demo`, `competition`) that owns its whole
  argument list (Hydra overrides, its own `--help`): everything after the command name goes
  to its `main(argv, prog=...)`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

from metadist import __version__
from metadist.commands.parser import Parser
from metadist.options import closest
from metadist.user_code import user_error_line

# command -> its module (imported only when that command runs). One line per command.
COMMANDS = {
    "train": "metadist.commands.train",
    "eval": "metadist.commands.evaluate",
    "demo": "metadist.demo",
    "competition": "metadist.commands.competition",
    "synth": "metadist.commands.synth",
    "ingest": "metadist.commands.ingest",
    "verify": "metadist.commands.verify",
    "datasets": "metadist.commands.datasets",
    "slurm": "metadist.commands.slurm",
    "sweep": "metadist.commands.sweep",
    "forecast": "metadist.commands.forecast",
    "experiments": "metadist.commands.experiments",
}

# command -> its line in `metadist --help` (here, so that listing them imports nothing).
COMMAND_HELP = {
    "train": "meta-train an experiment, then evaluate it",
    "eval": "evaluate a training run on its held-out tasks",
    "demo": "the end-to-end demo: panel, store, training, evaluation",
    "competition": "a forecasting competition's whole protocol on a long-format data set",
    "synth": "write the synthetic sensor panel as Parquet",
    "ingest": "build a series store from Parquet files",
    "verify": "check a series store in full (checksums, time order, finite values)",
    "datasets": "write a public data set (M3, M1, tourism, UCR/UEA) as Parquet",
    "slurm": "run training as a Slurm job (torchrun on every node, checkpoint + requeue)",
    "sweep": "hyper-parameter sweep: an Optuna study whose trials are training runs",
    "forecast": "forecast new entities from their own history with a trained run",
    "experiments": "list the shipped experiments, or copy them to a directory to edit",
}


def build_parser(
    command: str | None = None, module: ModuleType | None = None
) -> argparse.ArgumentParser:
    """The `metadist` parser: every command listed with its help line, and (`module`
    given) the parser(s) that `module.register_cli` adds for `command`."""
    parser = Parser(
        prog="metadist", description="metadist: meta-learning across many related time series."
    )
    parser.add_argument("--version", action="version", version=f"metadist {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if name == command and module is not None:
            module.register_cli(subparsers)
        else:
            subparsers.add_parser(name, help=COMMAND_HELP.get(name), add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    module = None
    if command is not None:
        try:
            # numpy loads numpy.random on first use, and a Ctrl-C that lands during that
            # import is swallowed by the module's initialisation (the command then ran on
            # to its end): loaded with the command, before any of its work
            importlib.import_module("numpy.random")
            module = importlib.import_module(COMMANDS[command])
        except KeyboardInterrupt:  # Ctrl-C while the command loads (torch takes seconds)
            print(f"metadist {command}: interrupted", file=sys.stderr)
            return 130
        if not hasattr(module, "register_cli"):  # a workflow: it parses its own arguments
            return int(module.main(argv[1:], prog=f"metadist {command}") or 0)
    parser = build_parser(command, module)
    args, extra = parser.parse_known_args(argv)
    overrides = getattr(args, "overrides", getattr(args, "settings", None))
    if extra and isinstance(overrides, list) and all(_is_override(t) for t in extra):
        overrides += extra  # KEY=VALUE after the options: overrides, in the order given
        extra = []
    if extra:
        print(_unrecognized(parser, args, extra), file=sys.stderr)
        return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    prog = getattr(args, "prog", f"metadist {args.command}")
    status = 0
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader of stdout went away (`metadist verify STORE | head -1`). Every command
        # here prints after its work is done, so nothing failed but output no one wanted:
        # exit with the command's status (0 where the print itself broke), never a
        # traceback, and point stdout at /dev/null so the interpreter's last flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return status
    except (ValueError, OSError) as error:  # OSError: a full disk, an unwritable path, ...
        print(f"{prog}: error: {_one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - only the user's own code's, below
        line = user_error_line(error)  # a sampler or model of the user's that a run uses
        if line is None:
            raise  # metadist's own: its traceback is the report
        print(f"{prog}: error: {line}", file=sys.stderr)
        return 1
    return status


def _one_line(error: Exception) -> str:
    """The message of `error`; for an `OSError` of the system (`[Errno 13] Permission
    denied: 'x'`), the path and the reason (`x: permission denied`)."""
    if isinstance(error, OSError) and error.strerror and error.filename is not None:
        reason = error.strerror[:1].lower() + error.strerror[1:]
        if error.filename2 is not None:
            return f"{error.filename} -> {error.filename2}: {reason}"
        return f"{error.filename}: {reason}"
    return str(error)


def _is_override(token: str) -> bool:
    """Whether `token` reads as a Hydra override (`KEY=VALUE`, `+KEY=VALUE`, `~KEY`)."""
    return not token.startswith("-") and ("=" in token or token.startswith("~"))


def _unrecognized(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]
) -> str:
    """One line for arguments no parser took, with the closest flag of the command."""
    command = getattr(args, "command", None)
    flags: list[str] = []
    for action in parser._actions:  # the subcommand's own parser holds its flags
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            flags = list(action.choices[command]._option_string_actions)
    prog = f"metadist {command}" if command else "metadist"
    first = extra[0]
    flag = first.split("=")[0]
    guess = closest(flag, flags) if first.startswith("-") else None
    hint = f"; did you mean {guess}?" if guess else ""
    if guess == flag:  # an option of the command itself, given after its subcommand
        hint = f"; {flag} goes right after `{prog}`, before the rest"
    return f"{prog}: error: unrecognized argument {first}{hint} (see {prog} --help)"


if __name__ == "__main__":
    sys.exit(main())
