"""`metadist verify PATH`: the command line of `metadist.store.verify.verify`."""

from __future__ import annotations

import argparse

from metadist.store.verify import verify


def _run(args: argparse.Namespace) -> int:
    store = verify(args.path, progress=False if args.no_progress else None)
    print(
        f"{store.path}: ok ({store.num_entities:,} entities, {store.num_rows:,} rows, "
        f"checksums match)"
    )
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist verify PATH`."""
    parser = subparsers.add_parser(
        "verify",
        help="check a series store in full (checksums, time order, finite values)",
        description="Check a series store in full: recompute checksums, check time order "
        "within every entity and that all values are finite. Exit 0 if it is sound.",
    )
    parser.add_argument("path", metavar="PATH", help="store directory")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar, nor progress lines off a terminal",
    )
    parser.set_defaults(func=_run)
