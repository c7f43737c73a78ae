"""One table from the evaluations of several runs: `python -m metadist.eval.combine`.

    python -m metadist.eval.combine OUT_DIR RUN_DIR [RUN_DIR ...] [--title TITLE]

The command line of `metadist.eval.combine.combine_runs` (which says how runs are
pooled): `OUT_DIR` gets `metrics.json`, `metrics.md`, `tasks.parquet` and (when every run
kept its points) `forecasts.parquet`, and the table is printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metadist.commands.parser import Parser
from metadist.eval.combine import check_out_dir, combine_runs
from metadist.eval.report import markdown_report, write_report


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m metadist.eval.combine",
        description=__doc__.splitlines()[0],
        epilog="example: python -m metadist.eval.combine runs/all runs/yearly runs/monthly",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", type=Path, help="where the table goes")
    parser.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="evaluated runs")
    parser.add_argument("--title", default=None, help="the table's title")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_out_dir(args.out_dir, args.run_dirs)
        result = combine_runs(args.run_dirs, title=args.title)
    except (ValueError, FileNotFoundError) as error:
        print(f"metadist.eval.combine: error: {error}", file=sys.stderr)
        return 1
    paths = write_report(result, args.out_dir, directory=args.out_dir)
    print(markdown_report(result), end="")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
