"""Writing the synthetic panel: chunks of entities, shuffled and dealt to Parquet files."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metadist.datasets._output import atomic_output_dir, check_output_dir
from metadist.datasets.synthetic.generator import (
    _LENGTH_STREAM,
    _SHUFFLE_STREAM,
    SYNTHETIC_BYTES_PER_ROW,
    SYNTHETIC_ENTITY,
    SYNTHETIC_FEATURES,
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_LABEL,
    SYNTHETIC_NAN_FEATURES,
    SYNTHETIC_STRATA,
    SYNTHETIC_STRATUM,
    SYNTHETIC_TARGET,
    SYNTHETIC_TIME,
    TIMESTAMP_ORIGIN,
    TIMESTAMP_STEP_NS,
    _entity_series,
    _make_profiles,
)
from metadist.progress import Progress


@dataclass
class PanelSummary:
    """What `write_synthetic_panel` wrote.

    Attributes:
        out_dir: the panel directory.
        files: the Parquet files, sorted.
        num_entities: entities written.
        num_rows: rows written.
        num_bytes: size of the files on disk.
        entities_per_stratum: `{sensor_type: number of entities}`.
        num_labels: distinct labels used.
        num_nan: `{column: number of NaN cells}`.
        min_length: rows of the shortest entity.
        max_length: rows of the longest entity.
        time_kind: "int" or "timestamp".
        seed: the generator seed.
        seconds: wall time of the generation.
        ingest_args: the `metadist.ingest` keyword arguments that ingest the panel
            (`SYNTHETIC_INGEST_ARGS`).
    """

    out_dir: Path
    files: list[Path]
    num_entities: int
    num_rows: int
    num_bytes: int
    entities_per_stratum: dict[str, int]
    num_labels: int
    num_nan: dict[str, int]
    min_length: int
    max_length: int
    time_kind: str
    seed: int
    seconds: float = 0.0
    ingest_args: dict = field(default_factory=lambda: dict(SYNTHETIC_INGEST_ARGS))

    def __str__(self) -> str:
        strata = ", ".join(f"{name} {count}" for name, count in self.entities_per_stratum.items())
        nans = ", ".join(f"{name} {count}" for name, count in self.num_nan.items())
        rate = self.num_bytes / max(self.seconds, 1e-9) / 1e6
        return "\n".join(
            [
                f"synthetic panel at {self.out_dir}",
                f"  files     {len(self.files)} Parquet, {self.num_bytes / 1e6:.1f} MB "
                f"in {self.seconds:.1f} s ({rate:.1f} MB/s)",
                f"  entities  {self.num_entities} ({strata}), {self.num_labels} labels",
                f"  rows      {self.num_rows} (length {self.min_length}..{self.max_length}), "
                f"time {self.time_kind}, seed {self.seed}",
                f"  NaN cells {nans or 'none'}",
                f"  ingest    metadist ingest {self.out_dir} OUT "
                f"--entity-col {SYNTHETIC_ENTITY} --time-col {SYNTHETIC_TIME} "
                f"--features {','.join(SYNTHETIC_FEATURES)} --targets {SYNTHETIC_TARGET} "
                f"--stratum-col {SYNTHETIC_STRATUM} --label-col {SYNTHETIC_LABEL} "
                "--scaling per-entity --nan ffill",
            ]
        )


def panel_schema(time_kind: str = "int") -> pa.Schema:
    """The Arrow schema of a synthetic panel file."""
    time_type = pa.int64() if time_kind == "int" else pa.timestamp("ns")
    return pa.schema(
        [
            (SYNTHETIC_ENTITY, pa.string()),
            (SYNTHETIC_TIME, time_type),
            (SYNTHETIC_STRATUM, pa.string()),
            (SYNTHETIC_LABEL, pa.string()),
            *[(name, pa.float64()) for name in SYNTHETIC_FEATURES],
            (SYNTHETIC_TARGET, pa.float64()),
        ]
    )


class _Tally:
    """What the panel holds, counted while it is written."""

    def __init__(self) -> None:
        self.strata = dict.fromkeys((spec.name for spec in SYNTHETIC_STRATA), 0)
        self.labels: set[str] = set()
        self.nan = dict.fromkeys(SYNTHETIC_NAN_FEATURES, 0)

    def add(self, series: dict[str, np.ndarray | str]) -> None:
        self.strata[str(series["stratum"])] += 1
        self.labels.add(str(series["label"]))
        for name in SYNTHETIC_NAN_FEATURES:
            self.nan[name] += int(np.isnan(series[name]).sum())


def _entity_chunks(
    lengths: np.ndarray,
    seed: int,
    profiles: Any,
    nan_fraction: float,
    chunk_rows: int,
    tally: _Tally,
) -> Iterator[tuple[list[dict[str, np.ndarray | str]], int]]:
    """The entities' series in order, in chunks of at least `chunk_rows` rows (the last
    one shorter), each with its row count; every series is counted in `tally`."""
    num_entities = len(lengths)
    entity_width = max(6, len(str(num_entities - 1)))
    chunk: list[dict[str, np.ndarray | str]] = []
    chunk_size = 0
    for entity in range(num_entities):
        series = _entity_series(entity, int(lengths[entity]), seed, profiles, nan_fraction)
        series["entity_id"] = f"E{entity:0{entity_width}d}"
        tally.add(series)
        chunk.append(series)
        chunk_size += int(lengths[entity])
        if chunk_size >= chunk_rows or entity == num_entities - 1:
            yield chunk, chunk_size
            chunk, chunk_size = [], 0


def write_synthetic_panel(
    out_dir: str | os.PathLike,
    num_entities: int,
    length_range: tuple[int, int],
    seed: int = 0,
    num_files: int = 4,
    time_kind: str = "int",
    nan_fraction: float = 0.002,
    num_profiles: int = 8,
    chunk_rows: int = 1 << 19,
    max_file_row_groups: int = 128,
    overwrite: bool = False,
    progress: bool | None = None,
) -> PanelSummary:
    """Writes a synthetic sensor panel as Parquet files `part-NNNNN.parquet` in `out_dir`.

    Args:
        out_dir: directory to create; written in a hidden sibling and renamed into place.
        num_entities: number of series.
        length_range: (shortest, longest) entity length in rows, both inclusive.
        seed: generator seed (>= 0); the files are a deterministic function of all args.
        num_files: files written side by side; every chunk's rows are dealt among them at
            random, so an entity's rows are spread over several files.
        max_file_row_groups: a file that has received this many chunks is closed and its
            place taken by a new file. Large panels thus have more than `num_files`
            files, and the Parquet footers held in memory stay bounded.
        time_kind: "int" (int64 step) or "timestamp" (timestamp[ns], hourly).
        nan_fraction: share of NaN cells in `load`, `ambient` and `aux` (0 for none).
        num_profiles: profiles (labels) per sensor type.
        chunk_rows: rows generated and shuffled at a time; bounds the memory used.
        overwrite: replace a non-empty `out_dir` (only once the new panel is complete).
        progress: show progress on stderr; None: for large panels, a bar on a terminal
            and elsewhere (a batch job's log) a line every `progress.LINE_EVERY_S` s.

    Returns:
        A `PanelSummary`.

    Raises:
        ValueError: an argument out of range.
        FileExistsError: `out_dir` exists and is not empty, and not `overwrite`.
        Stopped: SIGTERM or SIGHUP arrived (`metadist.stop_signals`); nothing is left.
    """
    num_entities, length_range = _check_args(
        num_entities, length_range, seed, num_files, time_kind, nan_fraction, num_profiles
    )
    _check_sizes(chunk_rows, max_file_row_groups)
    out_dir = check_output_dir(out_dir, overwrite)
    started = time.perf_counter()
    lengths = _entity_lengths(seed, length_range, num_entities)
    num_rows = int(lengths.sum())
    schema = panel_schema(time_kind)
    tally = _Tally()
    chunks = _entity_chunks(
        lengths, seed, _make_profiles(seed, num_profiles), nan_fraction, chunk_rows, tally
    )
    show = progress if progress is not None or num_rows >= 2_000_000 else False
    with (
        atomic_output_dir(out_dir, overwrite) as partial,
        Progress(show, lines=show is None) as display,
    ):
        bar = display.counter("synth rows", num_rows, "rows", rate=True)
        with _FileDealer(partial, schema, num_files, max_file_row_groups) as dealer:
            _deal_chunks(chunks, dealer, schema, time_kind, seed, bar.advance)
    files = [out_dir / path.name for path in dealer.paths]  # renamed into place
    return PanelSummary(
        out_dir=out_dir,
        files=files,
        num_entities=num_entities,
        num_rows=num_rows,
        num_bytes=sum(path.stat().st_size for path in files),
        entities_per_stratum=tally.strata,
        num_labels=len(tally.labels),
        num_nan=tally.nan,
        min_length=int(lengths.min()),
        max_length=int(lengths.max()),
        time_kind=time_kind,
        seed=seed,
        seconds=time.perf_counter() - started,
    )


def _deal_chunks(
    chunks: Iterator[tuple[list[dict[str, np.ndarray | str]], int]],
    dealer: _FileDealer,
    schema: pa.Schema,
    time_kind: str,
    seed: int,
    advance: Callable[[int], None],
) -> None:
    """Writes each chunk's rows, shuffled among the dealer's files, and counts them."""
    for chunk_index, (chunk, chunk_size) in enumerate(chunks):
        table = _chunk_table(chunk, schema, time_kind)
        dealer.deal(table, np.random.default_rng([seed, _SHUFFLE_STREAM, chunk_index]))
        advance(chunk_size)


def num_entities_for_size(num_bytes: float, length_range: tuple[int, int]) -> int:
    """How many entities give a panel of about `num_bytes` on disk (within ~5%).

    Raises:
        ValueError: `num_bytes` is not positive.
    """
    if not num_bytes > 0:
        raise ValueError(f"synthetic panel: size must be positive, got {num_bytes} bytes")
    mean_length = (int(length_range[0]) + int(length_range[1])) / 2
    return max(1, round(num_bytes / (SYNTHETIC_BYTES_PER_ROW * mean_length)))


def _check_args(
    num_entities, length_range, seed, num_files, time_kind, nan_fraction, num_profiles
) -> tuple[int, tuple[int, int]]:
    if int(num_entities) < 1:
        raise ValueError(f"synthetic panel: num_entities must be >= 1, got {num_entities}")
    if len(length_range) != 2:
        raise ValueError(
            f"synthetic panel: length_range must be (shortest, longest), got {length_range}"
        )
    low, high = (int(v) for v in length_range)
    if not 1 <= low <= high:
        raise ValueError(
            f"synthetic panel: length_range must satisfy 1 <= shortest <= longest, got {low} {high}"
        )
    if int(seed) < 0:
        raise ValueError(f"synthetic panel: seed must be >= 0, got {seed}")
    if int(num_files) < 1:
        raise ValueError(f"synthetic panel: num_files must be >= 1, got {num_files}")
    if time_kind not in ("int", "timestamp"):
        raise ValueError(
            f"synthetic panel: time_kind must be 'int' or 'timestamp', got {time_kind!r}"
        )
    if not 0.0 <= float(nan_fraction) < 0.5:
        raise ValueError(f"synthetic panel: nan_fraction must be in [0, 0.5), got {nan_fraction}")
    if int(num_profiles) < 1:
        raise ValueError(f"synthetic panel: num_profiles must be >= 1, got {num_profiles}")
    return int(num_entities), (low, high)


def _entity_lengths(seed: int, length_range: tuple[int, int], num_entities: int) -> np.ndarray:
    """Each entity's length, drawn from the seed alone."""
    return np.random.default_rng([seed, _LENGTH_STREAM]).integers(
        length_range[0], length_range[1] + 1, size=num_entities
    )


def _check_sizes(chunk_rows, max_file_row_groups) -> None:
    if int(chunk_rows) < 1:
        raise ValueError(f"synthetic panel: chunk_rows must be >= 1, got {chunk_rows}")
    if int(max_file_row_groups) < 1:
        raise ValueError(
            f"synthetic panel: max_file_row_groups must be >= 1, got {max_file_row_groups}"
        )


def _chunk_table(chunk: list[dict], schema: pa.Schema, time_kind: str) -> pa.Table:
    lengths = np.array([len(series["y"]) for series in chunk])
    owner = np.repeat(np.arange(len(chunk)), lengths)

    def per_entity(key: str) -> pa.Array:
        return pa.array([series[key] for series in chunk], pa.string()).take(owner)

    starts = np.repeat([series["start"] for series in chunk], lengths)
    steps = starts + (np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths))
    if time_kind == "int":
        times = pa.array(steps.astype(np.int64), pa.int64())
    else:
        nanoseconds = TIMESTAMP_ORIGIN.astype(np.int64) + steps.astype(np.int64) * TIMESTAMP_STEP_NS
        times = pa.array(nanoseconds, pa.int64()).cast(pa.timestamp("ns"))
    columns = {
        SYNTHETIC_ENTITY: per_entity("entity_id"),
        SYNTHETIC_TIME: times,
        SYNTHETIC_STRATUM: per_entity("stratum"),
        SYNTHETIC_LABEL: per_entity("label"),
    }
    for name in (*SYNTHETIC_FEATURES, SYNTHETIC_TARGET):
        columns[name] = pa.array(np.concatenate([series[name] for series in chunk]), pa.float64())
    return pa.Table.from_pydict(columns, schema=schema)


class _FileDealer:
    """`num_files` Parquet writers side by side, each replaced by a new file when full."""

    def __init__(self, directory: Path, schema: pa.Schema, num_files: int, max_row_groups: int):
        self.directory, self.schema, self.max_row_groups = directory, schema, max_row_groups
        self.paths: list[Path] = []
        self._writers = [self._open() for _ in range(num_files)]
        self._row_groups = [0] * num_files

    def _open(self) -> pq.ParquetWriter:
        path = self.directory / f"part-{len(self.paths):05d}.parquet"
        self.paths.append(path)
        return pq.ParquetWriter(path, self.schema, compression="snappy")

    def deal(self, table: pa.Table, rng: np.random.Generator) -> None:
        """Shuffles the rows and deals each to a random file, one row group per file."""
        order = rng.permutation(table.num_rows)
        destination = rng.integers(len(self._writers), size=table.num_rows)[order]
        for slot in range(len(self._writers)):
            rows = order[destination == slot]
            if not len(rows):
                continue
            if self._row_groups[slot] == self.max_row_groups:
                self._writers[slot].close()
                self._writers[slot] = self._open()
                self._row_groups[slot] = 0
            self._writers[slot].write_table(table.take(rows), row_group_size=len(rows))
            self._row_groups[slot] += 1

    def __enter__(self) -> _FileDealer:
        return self

    def __exit__(self, *exc) -> None:
        for writer in self._writers:
            writer.close()
