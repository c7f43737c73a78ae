"""`metadist ingest SRC OUT ...`: the command line of `metadist.store.ingest.ingest`.

Imports only the store, so the command starts without torch (its start-up is part of
every ingest's wall time).
"""

from __future__ import annotations

import argparse
import sys
import time

from metadist.stop_signals import Stopped
from metadist.store.files import keep_heap_memory
from metadist.store.format import SCALING_KINDS
from metadist.store.ingest import (
    DEFAULT_BATCH_SIZE,
    MAX_BATCH_SIZE,
    MAX_WORKERS,
    NAN_POLICIES,
    ingest,
    summary,
)
from metadist.store.reader import SeriesStore


def _run(args: argparse.Namespace) -> int:
    keep_heap_memory()
    progress = False if args.no_progress else None
    began = time.perf_counter()
    try:
        store = _ingest(args, progress)
    except Stopped as stop:
        print(stop.line("ingest", "store", args.out), file=sys.stderr)
        return 128 + stop.signum
    elapsed = time.perf_counter() - began
    print(summary(store))
    rows_read = store.metadata["source"]["num_rows_read"]
    print(f"took       {elapsed:.1f} s ({rows_read / max(elapsed, 1e-9):,.0f} rows/s)")
    return 0


def _ingest(args: argparse.Namespace, progress: bool | None) -> SeriesStore:
    return ingest(
        args.src,
        args.out,
        entity_col=args.entity_col,
        time_col=args.time_col,
        features=args.features,
        targets=args.targets or (),
        stratum_col=args.stratum_col,
        label_col=args.label_col,
        scaling=args.scaling,
        nan=args.nan,
        min_length=args.min_length,
        batch_size=args.batch_size,
        workers=args.workers,
        memory_limit_mb=args.memory_limit,
        progress=progress,
    )


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist ingest SRC OUT ...`."""
    parser = subparsers.add_parser(
        "ingest",
        help="build a series store from Parquet files",
        description="Build a memory-mapped series store from long-format Parquet "
        "(one row per entity and time step). SRC is a Parquet file, a directory or a glob.",
    )
    parser.add_argument("src", metavar="SRC", help="Parquet file, directory or glob pattern")
    parser.add_argument("out", metavar="OUT", help="store directory to create or replace")
    parser.add_argument("--entity-col", required=True, help="column of entity ids")
    parser.add_argument("--time-col", required=True, help="column of integer times or timestamps")
    parser.add_argument("--features", required=True, help="comma-separated numeric columns")
    parser.add_argument("--targets", default="", help="comma-separated numeric target columns")
    parser.add_argument("--stratum-col", default=None, help="column constant within an entity")
    parser.add_argument("--label-col", default=None, help="column constant within an entity")
    parser.add_argument(
        "--scaling",
        choices=SCALING_KINDS,
        default="global",
        help="global (default: one mean/std per column), per-entity (each entity's own) or none",
    )
    parser.add_argument(
        "--nan",
        choices=NAN_POLICIES,
        default="error",
        help="NaN, inf or null in a feature or target: error (default) names the cell, "
        "ffill carries the entity's last finite value forward, drop removes the row",
    )
    parser.add_argument("--min-length", type=int, default=1, help="drop shorter entities")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"rows per record batch (default {DEFAULT_BATCH_SIZE:,}, at most {MAX_BATCH_SIZE:,})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="threads that decode and process the input (default: one per core; at most "
        f"{MAX_WORKERS}); the store is the same for any number",
    )
    parser.add_argument(
        "--memory-limit",
        type=int,
        default=256,
        metavar="MB",
        help="MB of finished work waiting between the workers and the main thread, and "
        "of store pages kept mapped (default 256); with --batch-size and --workers it "
        "bounds memory",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar, nor progress lines off a terminal",
    )
    parser.set_defaults(func=_run)
