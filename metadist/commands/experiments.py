"""`metadist experiments list | copy`: the shipped experiments, and a copy to edit.

Example:
    metadist experiments list
    metadist experiments copy ucr_protonet my_experiments
    metadist train --config-dir my_experiments experiment=ucr_protonet
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import textwrap
from pathlib import Path

from metadist.configs import copy_experiments, find_experiments_dir, list_experiments


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist experiments list` and `metadist experiments copy NAME DEST`."""
    parser = subparsers.add_parser(
        "experiments",
        help="list the shipped experiments, or copy them to a directory to edit",
        description="List the experiments (from --config-dir, $METADIST_EXPERIMENTS_DIR, "
        "./experiments or the configs shipped with the package), or copy the whole config "
        "tree to a new directory whose files you edit and run with --config-dir.",
    )
    parser.add_argument("--config-dir", default=None, help="the experiments directory to read")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="one line per experiment: its name and what it does")
    copy = actions.add_parser(
        "copy",
        help="copy the config tree to DEST (a new directory), checking NAME exists",
        description="Copy the whole config tree (config.yaml and every group) to DEST, a "
        "directory that must not exist yet; then edit DEST/experiment/NAME.yaml and run "
        "`metadist train --config-dir DEST experiment=NAME`.",
    )
    copy.add_argument("name", metavar="NAME", help="the experiment you mean to edit")
    copy.add_argument("destination", metavar="DEST", type=Path, help="a new directory")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    source = find_experiments_dir(args.config_dir)
    if args.action == "list":
        _print_list(source)
        return 0
    path = copy_experiments(source, args.destination, args.name)
    print(f"copied {source} to {args.destination}; edit {path} and run:")
    print(
        f"  metadist train --config-dir {shlex.quote(str(args.destination))} experiment={args.name}"
    )
    return 0


def _print_list(source: Path) -> None:
    """Each experiment with its whole summary, wrapped to the terminal under its name,
    then the choices of the groups an override picks (`learner=NAME`, `model=NAME`)."""
    experiments = list_experiments(source)
    width = max((len(e.name) for e in experiments), default=0)
    columns = max(shutil.get_terminal_size((100, 24)).columns, 60)
    indent = " " * (width + 4)
    print(f"experiments in {source}:")
    for experiment in experiments:
        print(
            textwrap.fill(
                experiment.summary,
                width=columns - 1,
                initial_indent=f"  {experiment.name:<{width}}  ",
                subsequent_indent=indent,
            )
        )
    for group in _GROUPS:
        names = sorted(p.stem for p in (source / group).glob("*.yaml"))
        if names:
            print(
                textwrap.fill(
                    ", ".join(names),
                    width=columns - 1,
                    initial_indent=f"{group}=NAME: ",
                    subsequent_indent="  ",
                )
            )


# the groups whose choices the list shows (a training override picks one: learner=protonet)
_GROUPS = ("learner", "model", "sampler", "optimizer")
