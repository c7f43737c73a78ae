"""`metadist synth OUT_DIR ...`: the command line of the synthetic panel.

The panel itself is `metadist.datasets.synthetic.write_synthetic_panel`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metadist.datasets._output import OutputDirNotEmptyError
from metadist.datasets.synthetic import num_entities_for_size, write_synthetic_panel
from metadist.stop_signals import Stopped


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist synth OUT_DIR --entities N --length-range A B --seed S ...`."""
    parser = subparsers.add_parser(
        "synth",
        help="write the synthetic sensor panel as Parquet",
        description="Write the synthetic sensor panel (shuffled rows, several Parquet files).",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", type=Path, help="directory to create")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--entities", type=int, help="number of series")
    size.add_argument(
        "--size-mb",
        type=float,
        help="instead of --entities: about this many MB of Parquet (entities derived)",
    )
    parser.add_argument(
        "--length-range",
        type=int,
        nargs=2,
        metavar=("A", "B"),
        required=True,
        help="shortest and longest series length in rows (inclusive)",
    )
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--files", type=int, default=4, help="number of Parquet files (default 4)")
    parser.add_argument(
        "--time-kind",
        choices=("int", "timestamp"),
        default="int",
        help="the time column: int64 steps (default) or timestamps at hourly steps",
    )
    parser.add_argument(
        "--nan-fraction",
        type=float,
        default=0.002,
        help="share of NaN cells in load/ambient/aux (default 0.002; 0 for a clean panel)",
    )
    parser.add_argument(
        "--profiles", type=int, default=8, help="labels per sensor type (default 8)"
    )
    parser.add_argument(
        "--chunk-rows", type=int, default=1 << 19, help="rows generated at a time (bounds memory)"
    )
    parser.add_argument(
        "--max-file-row-groups",
        type=int,
        default=128,
        help="chunks per file before a new file is started (default 128)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: on a terminal for large panels, else a line now and then)",
    )
    parser.set_defaults(func=_run_cli)


def _run_cli(args: argparse.Namespace) -> int:
    num_entities = args.entities
    if num_entities is None:
        num_entities = num_entities_for_size(args.size_mb * 1e6, args.length_range)
    try:
        summary = write_synthetic_panel(
            args.out_dir,
            num_entities=num_entities,
            length_range=tuple(args.length_range),
            seed=args.seed,
            num_files=args.files,
            time_kind=args.time_kind,
            nan_fraction=args.nan_fraction,
            num_profiles=args.profiles,
            chunk_rows=args.chunk_rows,
            max_file_row_groups=args.max_file_row_groups,
            overwrite=args.overwrite,
            progress=args.progress,
        )
    except OutputDirNotEmptyError as error:
        raise error.for_cli() from None
    except Stopped as stop:
        print(stop.line("synth", "panel", args.out_dir), file=sys.stderr)
        return 128 + stop.signum
    print(summary)
    return 0
