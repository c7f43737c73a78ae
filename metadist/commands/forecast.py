"""`metadist forecast RUN_DIR HISTORY.parquet --out FORECASTS.parquet`: `Run.forecast`
from the command line (`metadist.api`)."""

from __future__ import annotations

import argparse
import fnmatch
import glob
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

from metadist.api import load_run
from metadist.diskspace import check_writable
from metadist.durable import atomic_file


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist forecast RUN_DIR HISTORY.parquet --out FORECASTS.parquet`."""
    parser = subparsers.add_parser(
        "forecast",
        help="forecast new entities from their own history with a trained run",
        description=(
            "Adapt a trained run on each entity's own history (long format, as ingest "
            "takes it) and write its forecasts in original units."
        ),
    )
    parser.add_argument("run_dir", help="a run directory written by metadist train")
    parser.add_argument(
        "history",
        help="the new entities' history: a Parquet file, a directory of them or a glob "
        "pattern (as metadist ingest reads its input)",
    )
    parser.add_argument("--out", required=True, help="where to write the forecasts (Parquet)")
    parser.add_argument("--horizon", type=int, default=None, help="steps (default: the run's)")
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated: adapted, unadapted, naive, seasonal_naive, theta, or "
        "combinations such as adapted+theta (default: adapted, or the model a "
        "competition's validation chose for the run's horizon)",
    )
    parser.add_argument(
        "--no-guard",
        action="store_true",
        help="leave the model's forecasts unguarded where the run records a plausibility "
        "guard (guard.json, chosen on validation by metadist competition)",
    )
    parser.add_argument("--period", type=int, default=None, help="seasonal period m")
    parser.add_argument(
        "--allow-import",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module the run's `imports` may import (repeatable); a received run runs "
        "no code unless allowed",
    )
    parser.add_argument(
        "--ensemble", nargs="*", default=None, help="other run directories to average with"
    )
    parser.add_argument(
        "--store",
        default=None,
        help="the run's series store, where the run's inference.json finds none (it must "
        "be the store the run was trained on)",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars, nor progress lines off a terminal",
    )
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    """Loads the run, forecasts the history and writes the forecasts atomically."""
    if args.period is not None and args.period < 1:  # before the run is loaded
        raise ValueError(f"--period must be >= 1, got {args.period}")
    out = Path(args.out)
    if out.is_dir():  # checked before any work: the file is written last
        raise ValueError(
            f"--out {out} is a directory; name the file, e.g. {out / 'forecasts.parquet'}"
        )
    above = next(p for p in out.absolute().parents if p.exists())  # the nearest that is
    if not above.is_dir():
        raise ValueError(f"--out {out}: {above} is a file, not a directory")
    _check_not_the_history(out, Path(args.history))
    # a read-only run is forecast from, not written to: --out inside it is refused now
    where = os.path.normpath(above)
    check_writable(where, f"the forecasts (--out {out})", "write them elsewhere")
    run = load_run(
        args.run_dir, ensemble=args.ensemble, store=args.store, allow_imports=args.allow_import
    )
    table = run.forecast(
        args.history,
        horizon=args.horizon,
        methods=None
        if args.methods is None
        else [m.strip() for m in args.methods.split(",") if m.strip()],
        period=args.period,
        guard=not args.no_guard,
        progress=False if args.no_progress else None,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as temporary:
        pq.write_table(table, temporary)
    entities = len(set(table.column(0).to_pylist()))
    print(
        f"forecasts of {entities} {'entity' if entities == 1 else 'entities'} written to {out}",
        file=sys.stderr,
    )
    return 0


def _check_not_the_history(out: Path, history: Path) -> None:
    """Refuses an `--out` that would replace the history it forecasts: the same file
    (through any path or link), a file inside a history directory, or one that a history
    pattern (a glob) matches or holds.

    Raises:
        ValueError: naming both.
    """
    target, source = out.resolve(), history.resolve()
    if target == source or (out.exists() and history.exists() and out.samefile(history)):
        raise ValueError(
            f"--out {out} is the history {history}: the forecasts would replace it; name "
            "another file"
        )
    if source.is_dir() and source in target.parents:
        raise ValueError(
            f"--out {out} is inside the history directory {history}: the forecasts would "
            "be read as history next time; write them elsewhere"
        )
    if not history.exists() and set("*?[") & set(str(history)):  # a glob, as ingest takes
        matched = [Path(m).resolve() for m in glob.glob(str(history), recursive=True)]
        inside = any(m.is_dir() and m in target.parents for m in matched)
        pattern = os.path.abspath(history)  # `*` stays in one directory, `**` spans them
        matches = fnmatch.fnmatch if "**" in pattern else lambda path, p: Path(path).match(p)
        if inside or matches(str(target), pattern):
            raise ValueError(
                f"--out {out} is matched by the history pattern {history}: the forecasts "
                "would be read as history next time; write them elsewhere"
            )
