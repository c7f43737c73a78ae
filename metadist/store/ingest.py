"""Ingest: Parquet (any number of files, rows in any order) → series store.

Memory stays bounded by the record-batch size, the number of workers and the
per-entity statistics, never by the size of the input:

1. **Scan** (`scan.py`). Check schemas, count rows per entity, check that stratum and
   label are constant within each entity, and gather count/mean/M2 per column, per
   entity and (by merging) globally. Float32 values are also copied raw to their input
   position in `values.bin`. What it learned is frozen into an `IngestPlan` (`plan.py`).
2. **Write** (`write.py`). Scale each batch and write every row straight into its
   entity's region of the preallocated `values.bin` / `times.bin`.
3. **Order** (`order.py`). Walk the file in chunks of whole entities: sort each entity's
   rows by time, reject duplicate times, forward-fill if asked, and checksum the final
   bytes. With two workers or more, chunks that pass 2 has written whole are done
   while pass 2 goes on (`order.EarlyFinisher`), so their writes to disk overlap it.

When the input is already in store order (entities sorted by id, each entity's rows
together and in time order) and its values are float32, passes 2 and 3 are one pass
that scales pass 1's copy in place (`order.finish_in_place`). Every pass runs on a pool
of `workers` threads (pass 2 with two or more also on the early finisher's); results and
error messages do not depend on their number.

Everything is written into a temporary sibling of OUT, fsynced, and renamed into place
(an existing store at OUT is swapped atomically), so OUT holds either a whole store or
nothing. The command line, `metadist ingest`, is `metadist.commands.ingest`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from metadist.diskspace import needs_space
from metadist.durable import refuse_working_directory
from metadist.stop_signals import stops_held, stops_raised
from metadist.store import sources
from metadist.store.files import (
    RawFile,
    publish,
    remove_stale_temps,
    temp_sibling,
)
from metadist.store.finish import estimated_store_bytes, write_index_and_metadata
from metadist.store.format import (
    SCALING_KINDS,
    TIMES_DTYPE,
    TIMES_FILE,
    VALUES_DTYPE,
    VALUES_FILE,
    is_store,
)
from metadist.store.ingest_arguments import check_argument_types
from metadist.store.input_files import resolve_paths
from metadist.store.order import finish_in_place, order_rows
from metadist.store.parallel import default_workers
from metadist.store.plan import make_plan
from metadist.store.progress import progress_bar
from metadist.store.reader import SeriesStore
from metadist.store.scan import scan
from metadist.store.settings import IngestSettings
from metadist.store.write import write

NAN_POLICIES = ("error", "ffill", "drop")
DEFAULT_BATCH_SIZE = 65_536
# A batch is decoded whole (about 2 per worker at once): 16M rows of a few float64
# columns is already GBs. Each worker is a thread with its own batches; more than a few
# hundred only queue behind the cores (the store is the same for any number).
MAX_BATCH_SIZE = 1 << 24
MAX_WORKERS = 256


def ingest(
    src: str | Path,
    out: str | Path,
    *,
    entity_col: str,
    time_col: str,
    features: Sequence[str],
    targets: Sequence[str] = (),
    stratum_col: str | None = None,
    label_col: str | None = None,
    scaling: str = "global",
    nan: str = "error",
    min_length: int = 1,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int | None = None,
    memory_limit_mb: int = 256,
    progress: bool | None = None,
) -> SeriesStore:
    """Builds a series store at `out` from the Parquet input `src`.

    Args:
        src: a Parquet file, a directory of Parquet files (searched recursively; names
            starting with `.` or `_` are skipped) or a glob pattern. An entity's rows may
            be spread over several files, in any order.
        out: the store directory to create (an existing store there is replaced
            atomically; any other existing path is refused).
        entity_col: column of entity ids (strings or integers).
        time_col: column of integer times, timestamps or dates.
        features: numeric input columns, in store column order.
        targets: numeric target columns; those not among `features` are appended.
        stratum_col: optional column constant within each entity (e.g. sensor type).
        label_col: optional column constant within each entity (e.g. a class).
        scaling: `"global"` (one mean/std per column), `"per-entity"` or `"none"`.
        nan: what to do with NaN/inf/null values: `"error"` stops, `"ffill"` carries the
            last finite value forward within the entity (values before the first finite
            one take that first value), `"drop"` removes the row.
        min_length: entities with fewer rows are dropped (reported in the metadata).
        batch_size: rows per Parquet record batch, at most `MAX_BATCH_SIZE`; bounds
            memory (about `workers * 2` batches are decoded at once).
        workers: threads that decode and process row groups (None: one per core), at
            most `MAX_WORKERS`; the store is the same byte for byte for any number.
        memory_limit_mb: results the workers have finished and the main thread has not
            merged yet (per-batch statistics, finished chunks) are held up to this many
            MB, and pass 2 keeps up to this many MB of store pages mapped (half for the
            values); with the workers' current batches and the per-entity statistics,
            this bounds the ingest's memory whatever the size or layout of the input.
        progress: show a progress bar on stderr; None shows it when stderr is a terminal,
            else a line every 15 seconds.

    Returns:
        The new store, opened.

    Raises:
        FileNotFoundError: `src` does not exist or matches nothing.
        FileExistsError: `out` exists and is not a series store.
        Stopped: SIGTERM or SIGHUP arrived (where their handler is Python's default); the
            temporary directory is removed and `out` is as it was (a `SystemExit` of
            status 128 + the signal's number, `metadist.stop_signals`), or, where it came
            as the store was put in place, the new store is at `out` (`written`).
        ValueError: bad arguments or bad input (missing or non-numeric column, NaN/inf
            under `nan="error"`, duplicate (entity, time), stratum or label not constant
            within an entity, no entity long enough, empty input, a corrupt file, a column
            read missing from a file, an id or time column of another type there). The
            message names the file, column, entity and row where they apply; nothing is
            left at `out`.
    """
    check_argument_types(locals())
    features, targets, options = _check_arguments(
        features, targets, scaling, nan, min_length, batch_size, workers, memory_limit_mb
    )
    columns = sources.Columns(
        entity_col, time_col, tuple(features), tuple(targets), stratum_col, label_col
    )
    out = _check_out(Path(out))
    with stops_raised():  # SIGTERM or SIGHUP: the temporary directory is removed too
        remove_stale_temps(out)
        files, schema, columns = _read_sources(src, out, columns)
        _write_store(out, src, files, schema, columns, options, progress)
    return SeriesStore.open(out)


def _write_store(
    out: Path,
    src: str | Path,
    files: list[sources.SourceFile],
    schema: pa.Schema,
    columns: sources.Columns,
    options: dict[str, Any],
    progress: bool | None,
) -> None:
    """Runs the passes into a temporary sibling of `out` and publishes it at `out`.

    `options` are `IngestSettings`'s (scaling, nan, min_length, batch_size, workers,
    memory_limit). Whatever fails, no temporary directory is left behind.

    Raises:
        OutOfSpaceError: the disk filled up (naming `out` and the size needed).
        ValueError: bad input found by a pass.
    """
    with needs_space(out, "the store", lambda: estimated_store_bytes(files, columns)):
        temp = temp_sibling(out)
        try:
            settings = IngestSettings.of(files, schema, columns, **options)
            with progress_bar(progress) as bar:
                _build(settings, temp, src, bar)
            with stops_held():  # a stop now comes after the store is in place
                publish(temp, out)
        finally:
            if temp.exists():
                shutil.rmtree(temp, ignore_errors=True)


def _check_arguments(
    features: Sequence[str],
    targets: Sequence[str],
    scaling: str,
    nan: str,
    min_length: int,
    batch_size: int,
    workers: int | None,
    memory_limit_mb: int,
) -> tuple[list[str], list[str], dict[str, Any]]:
    """`(features, targets, options)`: the column lists as lists, and the options as
    `IngestSettings` takes them (the workers resolved, the memory limit in bytes).

    Raises:
        ValueError: a column listed twice, no feature, or an option out of range (named
            as its command-line flag).
    """
    feature_names = _names(features, "features")
    target_names = _names(targets, "targets")
    if not feature_names:
        raise ValueError("--features needs at least one column")
    if scaling not in SCALING_KINDS:
        raise ValueError(f"--scaling must be one of {list(SCALING_KINDS)}, not {scaling!r}")
    if nan not in NAN_POLICIES:
        raise ValueError(f"--nan must be one of {list(NAN_POLICIES)}, not {nan!r}")
    if int(min_length) < 1:
        raise ValueError(f"--min-length must be at least 1, not {min_length}")
    if not 1 <= int(batch_size) <= MAX_BATCH_SIZE:
        raise ValueError(
            f"--batch-size must be between 1 and {MAX_BATCH_SIZE:,} (rows), not {batch_size}"
        )
    workers = min(default_workers(), MAX_WORKERS) if workers is None else workers
    if not 1 <= int(workers) <= MAX_WORKERS:
        raise ValueError(f"--workers must be between 1 and {MAX_WORKERS} (threads), not {workers}")
    if int(memory_limit_mb) < 1:
        raise ValueError(f"--memory-limit must be at least 1 (MB), not {memory_limit_mb}")
    options = {
        "scaling": scaling,
        "nan": nan,
        "min_length": int(min_length),
        "batch_size": int(batch_size),
        "workers": int(workers),
        "memory_limit": int(memory_limit_mb) << 20,
    }
    return feature_names, target_names, options


def _check_out(out: Path) -> Path:
    """`out`, where a store may be written: nothing there yet or a store, in a directory.

    Raises:
        FileExistsError: `out` exists and is not a series store.
        FileNotFoundError: its parent directory does not exist.
        NotADirectoryError: its parent is a file.
        ValueError: `out` is the working directory or contains it.
    """
    if out.exists() and not is_store(out):
        raise FileExistsError(
            f"{out} exists and is not a series store; remove it or choose another output"
        )
    if (out / "checkpoints").is_dir():  # a run trained into the store's directory
        raise FileExistsError(
            f"{out} is a series store that also holds a training run (checkpoints/), which "
            "replacing the store would delete; move the run out or choose another output"
        )
    if out.parent.exists() and not out.parent.is_dir():
        raise NotADirectoryError(f"cannot create {out}: {out.parent} is not a directory")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"the parent directory of {out} does not exist")
    refuse_working_directory(out, "OUT")
    return out


def _read_sources(
    src: str | Path, out: Path, columns: sources.Columns
) -> tuple[list[sources.SourceFile], pa.Schema, sources.Columns]:
    """The input files of `src` and their common schema, checked against `columns`, and
    `columns` with each name as the input spells it.

    Raises:
        FileNotFoundError: `src` matches nothing.
        ValueError: `out` is `src` or holds it, a column given two roles, files that do
            not fit `columns` or one another in the columns it names, or no rows at all.
    """
    source, target = Path(os.path.realpath(src)), Path(os.path.realpath(out))
    if Path(src).exists() and (source == target or target in source.parents):
        raise ValueError(f"OUT {out} is the input SRC {src} or holds it; write the store elsewhere")
    opened = sources.open_sources(resolve_paths(src, exclude=out))
    if not any(file.num_rows for file, _ in opened):
        raise ValueError(f"empty input: {src} has no rows")
    columns = _spaced_names(columns, sources.reference_schema(opened)[1].names)
    used = [name for name, _ in columns.roles()]
    repeated = sorted({n for n in used if used.count(n) > 1} - set(columns.targets))
    if repeated:
        raise ValueError(f"columns {repeated} are given more than one role")
    files, schema = sources.check_sources(opened, columns)
    return files, schema, columns


def _build(settings: IngestSettings, temp, src: str | Path, bar) -> None:
    """Runs the passes into the temporary directory `temp`."""
    raw = None
    if settings.float32_values:
        num_columns = len(settings.value_names)
        row_bytes = num_columns * VALUES_DTYPE.itemsize
        raw = (
            RawFile(temp / VALUES_FILE, row_bytes, settings.num_rows_read),
            RawFile(temp / TIMES_FILE, TIMES_DTYPE.itemsize, settings.num_rows_read),
        )
    try:
        found = scan(settings, bar, raw)
    finally:
        for file in raw or ():
            file.close()
    timings = {"scan_s": found.seconds}
    plan = make_plan(settings, found)
    if plan.in_place:
        checksums, timings["finish_s"] = finish_in_place(settings, plan, temp, bar)
    else:
        for name in (VALUES_FILE, TIMES_FILE):
            (temp / name).unlink(missing_ok=True)
        plan, early, timings["write_s"] = write(settings, found, plan, temp, bar)
        checksums, timings["order_s"] = order_rows(settings, plan, temp, bar, early)
    write_index_and_metadata(settings, plan, temp, src, checksums, timings)


def _names(value: str | Sequence[str], option: str) -> list[str]:
    if isinstance(value, str):
        # Spaces are kept for now: `a, b` means columns a and b, but a column may itself
        # begin with a space (`_spaced_names` decides once the schema is known).
        value = [part for part in value.split(",") if part.strip()]
    names = list(value)
    if len({name.strip() for name in names}) != len(names):
        raise ValueError(f"--{option} lists a column twice: {[n.strip() for n in names]}")
    return names


def _spaced_names(columns: sources.Columns, schema_names: list[str]) -> sources.Columns:
    """`columns` with each listed name as the input has it: exactly as typed when the
    input has such a column (`' price'`), else without surrounding spaces."""

    def match(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(name if name in schema_names else name.strip() for name in names)

    return replace(columns, features=match(columns.features), targets=match(columns.targets))


def summary(store: SeriesStore) -> str:
    """A short human-readable account of a store: sizes, strata, dropped entities."""
    meta = store.metadata
    lines = [
        f"store      {store.path}",
        f"entities   {store.num_entities:,}   rows {store.num_rows:,}   columns "
        f"{', '.join(store.column_names)}",
        f"scaling    {meta['scaling']['kind']}   nan {meta['nan_policy']}   "
        f"time {meta['time_col']} ({meta['time_kind']})",
        f"source     {meta['source']['num_files']} file(s), "
        f"{meta['source']['num_rows_read']:,} rows read",
    ]
    strata = meta.get("strata", {})
    if len(strata) > 1 or "" not in strata:
        lines.append("strata")
        for name, entry in sorted(strata.items()):
            lines.append(
                f"  {name or '(none)':<20} {entry['entities']:>10,} entities {entry['rows']:>14,} rows"
            )
    dropped = meta.get("dropped", {})
    if dropped.get("num_entities"):
        lines.append(f"dropped    {dropped['num_entities']:,} entities")
        for entry in dropped["entities"][:10]:
            lines.append(f"  {entry['entity_id']}: {entry['reason']}")
        if dropped["num_entities"] > 10:
            lines.append(f"  ... and {dropped['num_entities'] - 10:,} more (see metadata.json)")
    else:
        lines.append("dropped    none")
    return "\n".join(lines)
