"""The synthetic sensor panel: many related series as shuffled, multi-file Parquet.

Every entity is one sensor of one of four types (the strata). A type fixes the seasonal
period, the number of harmonics, the noise level, the trend and whether the amplitude
switches between regimes. Within a type, each entity follows one of a few *profiles*
(its `label`): the shape of the seasonal cycle (relative harmonic magnitudes and phases),
the noise multiplier and the sensitivity to the covariates. Entities of one profile
share that structure but differ in level, amplitude, phase, trend and covariate
realisations — so a model adapted on an entity's own history forecasts it better than a
model that has only seen the population, and the profile is a class label for N-way
K-shot tasks.

Columns (names in the module constants):

- `entity_id` (string), `time` (int64 step, or timestamp[ns] at hourly steps),
  `sensor_type` (stratum), `label` (profile, constant per entity);
- features: `cycle_sin`, `cycle_cos` (position in the type's seasonal cycle, calendar-like,
  never missing), `load` (smooth operating load the sensor responds to), `ambient`
  (site temperature with a daily cycle), `aux` (a co-located, noisier second sensor);
  `load`, `ambient` and `aux` have a few NaNs unless `nan_fraction=0`;
- target `y` (never missing).

Rows are generated entity by entity in chunks of about `chunk_rows` rows; each chunk is
shuffled and dealt row by row to the output files, which receive it as one row group.
Memory is bounded by the chunk size, not by the panel size, and the output is a
deterministic function of the arguments.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metadist.datasets._output import OutputDirNotEmptyError, atomic_output_dir, check_output_dir
from metadist.progress import Progress

SYNTHETIC_ENTITY = "entity_id"
SYNTHETIC_TIME = "time"
SYNTHETIC_STRATUM = "sensor_type"
SYNTHETIC_LABEL = "label"
SYNTHETIC_FEATURES = ("cycle_sin", "cycle_cos", "load", "ambient", "aux")
SYNTHETIC_TARGET = "y"
SYNTHETIC_NAN_FEATURES = ("load", "ambient", "aux")
SYNTHETIC_COLUMNS = (
    SYNTHETIC_ENTITY,
    SYNTHETIC_TIME,
    SYNTHETIC_STRATUM,
    SYNTHETIC_LABEL,
    *SYNTHETIC_FEATURES,
    SYNTHETIC_TARGET,
)
# Keyword arguments of `metadist.store.ingest` for a synthetic panel.
SYNTHETIC_INGEST_ARGS = {
    "entity_col": SYNTHETIC_ENTITY,
    "time_col": SYNTHETIC_TIME,
    "features": SYNTHETIC_FEATURES,
    "targets": (SYNTHETIC_TARGET,),
    "stratum_col": SYNTHETIC_STRATUM,
    "label_col": SYNTHETIC_LABEL,
    # Sensors differ in level and scale by orders of magnitude: each entity is scaled by
    # its own statistics (without it, synthetic_maml trains a model worse than naive).
    "scaling": "per-entity",
    # The panel has NaN cells (sensor dropouts): carry the last value forward.
    "nan": "ffill",
}
# Timestamps are hourly steps from this instant.
TIMESTAMP_ORIGIN = np.datetime64("2020-01-01T00:00:00", "ns")
TIMESTAMP_STEP_NS = 3600 * 1_000_000_000

# Parquet bytes per row with the default settings (measured: 45.7-47.0 over lengths
# 50-4000 and both time kinds); used to size a panel by bytes instead of entities.
SYNTHETIC_BYTES_PER_ROW = 46

_MAX_START = 8760  # entities start within the first year of steps
_PROFILE_STREAM = 1
_LENGTH_STREAM = 2
_ENTITY_STREAM = 3
_SHUFFLE_STREAM = 4


@dataclass(frozen=True)
class StratumSpec:
    """What one sensor type looks like.

    Attributes:
        name: the stratum value written in `sensor_type`.
        weight: expected share of the entities.
        period: seasonal period in steps.
        num_harmonics: harmonics in the seasonal shape (>= 2, so profiles differ in shape).
        level: (mean, sd) of an entity's level.
        amplitude: (low, high) of the log-uniform seasonal amplitude.
        noise: disturbance sd relative to the amplitude.
        trend: sd of the per-step trend slope relative to the amplitude.
        memory: coefficient of the exponential moving-average disturbance (0 = white).
        regimes: amplitude multipliers an entity switches between (one value: no switching).
        regime_steps: mean steps between regime switches.
    """

    name: str
    weight: float
    period: int
    num_harmonics: int
    level: tuple[float, float]
    amplitude: tuple[float, float]
    noise: float
    trend: float
    memory: float
    regimes: tuple[float, ...] = (1.0,)
    regime_steps: int = 0


SYNTHETIC_STRATA = (
    StratumSpec("temperature", 0.40, 24, 2, (20.0, 6.0), (1.5, 6.0), 0.08, 5e-4, 0.8),
    StratumSpec(
        "vibration", 0.25, 8, 4, (2.0, 0.5), (0.2, 1.5), 0.30, 0.0, 0.3, (0.6, 1.0, 2.5), 300
    ),
    StratumSpec("pressure", 0.20, 12, 2, (100.0, 15.0), (0.5, 3.0), 0.05, 2e-3, 0.95),
    StratumSpec("flow", 0.15, 48, 3, (50.0, 15.0), (5.0, 25.0), 0.12, 2e-4, 0.6, (0.3, 1.0), 500),
)
SYNTHETIC_PERIODS = {spec.name: spec.period for spec in SYNTHETIC_STRATA}


@dataclass(frozen=True)
class _Profile:
    label: str
    magnitudes: np.ndarray  # [H], sums to 1
    phases: np.ndarray  # [H], first is 0 (the entity phase absorbs it)
    noise_scale: float
    load_coef: float
    ambient_coef: float


@dataclass
class PanelSummary:
    """What `write_synthetic_panel` wrote.

    Attributes:
        out_dir: the panel directory.
        files: the Parquet files, sorted.
        num_entities, num_rows: totals.
        num_bytes: size of the files on disk.
        entities_per_stratum: `{sensor_type: number of entities}`.
        num_labels: distinct labels used.
        num_nan: `{column: number of NaN cells}`.
        min_length, max_length: shortest and longest entity.
        time_kind: "int" or "timestamp".
        seed: the generator seed.
        seconds: wall time of the generation.
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
        progress: show a progress bar; None shows one on a terminal for large panels.

    Returns:
        A `PanelSummary`.

    Raises:
        ValueError: an argument out of range.
        FileExistsError: `out_dir` exists and is not empty, and not `overwrite`.
    """
    num_entities, length_range = _check_args(
        num_entities,
        length_range,
        seed,
        num_files,
        time_kind,
        nan_fraction,
        num_profiles,
        chunk_rows,
    )
    if int(max_file_row_groups) < 1:
        raise ValueError(
            f"synthetic panel: max_file_row_groups must be >= 1, got {max_file_row_groups}"
        )
    out_dir = check_output_dir(out_dir, overwrite)
    started = time.perf_counter()
    profiles = _make_profiles(seed, num_profiles)
    lengths = np.random.default_rng([seed, _LENGTH_STREAM]).integers(
        length_range[0], length_range[1] + 1, size=num_entities
    )
    num_rows = int(lengths.sum())
    schema = panel_schema(time_kind)
    entity_width = max(6, len(str(num_entities - 1)))
    strata_count = dict.fromkeys((spec.name for spec in SYNTHETIC_STRATA), 0)
    labels_seen: set[str] = set()
    nan_count = dict.fromkeys(SYNTHETIC_NAN_FEATURES, 0)
    show = progress if progress is not None else (sys.stderr.isatty() and num_rows >= 2_000_000)

    with atomic_output_dir(out_dir, overwrite) as partial, Progress(show, lines=False) as display:
        bar = display.counter("synth rows", num_rows, "rows", rate=True)
        with _FileDealer(partial, schema, num_files, max_file_row_groups) as dealer:
            chunk: list[dict[str, np.ndarray | str]] = []
            chunk_size = 0
            chunk_index = 0
            for entity in range(num_entities):
                series = _entity_series(entity, int(lengths[entity]), seed, profiles, nan_fraction)
                series["entity_id"] = f"E{entity:0{entity_width}d}"
                strata_count[series["stratum"]] += 1
                labels_seen.add(series["label"])
                for name in SYNTHETIC_NAN_FEATURES:
                    nan_count[name] += int(np.isnan(series[name]).sum())
                chunk.append(series)
                chunk_size += int(lengths[entity])
                if chunk_size >= chunk_rows or entity == num_entities - 1:
                    table = _chunk_table(chunk, schema, time_kind)
                    dealer.deal(table, np.random.default_rng([seed, _SHUFFLE_STREAM, chunk_index]))
                    bar.advance(chunk_size)
                    chunk, chunk_size = [], 0
                    chunk_index += 1
        files = dealer.paths
        num_bytes = sum(path.stat().st_size for path in files)

    return PanelSummary(
        out_dir=out_dir,
        files=[out_dir / path.name for path in files],
        num_entities=num_entities,
        num_rows=num_rows,
        num_bytes=num_bytes,
        entities_per_stratum=strata_count,
        num_labels=len(labels_seen),
        num_nan=nan_count,
        min_length=int(lengths.min()),
        max_length=int(lengths.max()),
        time_kind=time_kind,
        seed=seed,
        seconds=time.perf_counter() - started,
    )


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
    num_entities, length_range, seed, num_files, time_kind, nan_fraction, num_profiles, chunk_rows
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
    if int(chunk_rows) < 1:
        raise ValueError(f"synthetic panel: chunk_rows must be >= 1, got {chunk_rows}")
    return int(num_entities), (low, high)


def _make_profiles(seed: int, num_profiles: int) -> list[list[_Profile]]:
    """`[stratum][profile]`; depends on (seed, stratum, profile) only."""
    profiles = []
    for stratum_index, spec in enumerate(SYNTHETIC_STRATA):
        row = []
        for index in range(num_profiles):
            rng = np.random.default_rng([seed, _PROFILE_STREAM, stratum_index, index])
            magnitudes = np.concatenate([[1.0], rng.uniform(0.05, 1.0, spec.num_harmonics - 1)])
            phases = np.concatenate([[0.0], rng.uniform(0.0, 2 * np.pi, spec.num_harmonics - 1)])
            row.append(
                _Profile(
                    label=f"{spec.name}-{index:02d}",
                    magnitudes=magnitudes / magnitudes.sum(),
                    phases=phases,
                    noise_scale=float(np.exp(rng.uniform(np.log(0.5), np.log(2.0)))),
                    load_coef=float(rng.uniform(-1.0, 1.0)),
                    ambient_coef=float(rng.uniform(-0.5, 0.5)),
                )
            )
        profiles.append(row)
    return profiles


_STRATUM_WEIGHTS = np.array([spec.weight for spec in SYNTHETIC_STRATA]) / sum(
    spec.weight for spec in SYNTHETIC_STRATA
)


def _entity_series(
    entity: int, length: int, seed: int, profiles: list[list[_Profile]], nan_fraction: float
) -> dict:
    """One entity's columns `[length]`; depends on (seed, entity, length, profiles) only."""
    rng = np.random.default_rng([seed, _ENTITY_STREAM, entity])
    stratum_index = int(rng.choice(len(SYNTHETIC_STRATA), p=_STRATUM_WEIGHTS))
    spec = SYNTHETIC_STRATA[stratum_index]
    profile = profiles[stratum_index][int(rng.integers(len(profiles[stratum_index])))]
    start = int(rng.integers(0, _MAX_START))
    steps = np.arange(length, dtype=np.float64)
    clock = start + steps  # absolute time in steps

    level = rng.normal(*spec.level)
    amplitude = float(np.exp(rng.uniform(*np.log(spec.amplitude))))
    phase = rng.uniform(0.0, spec.period)
    magnitudes = profile.magnitudes * (1.0 + 0.05 * rng.standard_normal(spec.num_harmonics))
    phases = profile.phases + 0.1 * rng.standard_normal(spec.num_harmonics)
    harmonics = np.arange(1, spec.num_harmonics + 1, dtype=np.float64)[:, None]
    angle = 2 * np.pi * harmonics * (clock + phase)[None, :] / spec.period + phases[:, None]
    season = (magnitudes[:, None] * np.cos(angle)).sum(axis=0)

    regime = _regime_multiplier(rng, spec, length)
    slope = rng.normal(0.0, spec.trend * amplitude) if spec.trend > 0 else 0.0
    noise_sd = spec.noise * amplitude * profile.noise_scale
    disturbance = noise_sd * regime * _smoothed_noise(rng, length, spec.memory)

    load = _smooth_process(rng, clock, spec.period)
    weather = _smooth_process(rng, clock, 24 * 7)
    ambient = 12.0 + 6.0 * np.cos(2 * np.pi * (clock - 15.0) / 24.0) + 4.0 * weather
    ambient += 0.3 * rng.standard_normal(length)

    y = (
        level
        + slope * steps
        + amplitude * regime * season
        + 0.5 * amplitude * profile.load_coef * load
        + 0.3 * amplitude * profile.ambient_coef * (ambient - 12.0) / 6.0
        + disturbance
    )
    gain = rng.uniform(0.8, 1.2)
    aux = gain * (y - level) + rng.normal(0.0, amplitude)
    aux += (0.5 * noise_sd + 0.05 * amplitude) * rng.standard_normal(length)

    cycle = 2 * np.pi * (clock % spec.period) / spec.period
    series = {
        "stratum": spec.name,
        "label": profile.label,
        "start": start,
        "cycle_sin": np.sin(cycle),
        "cycle_cos": np.cos(cycle),
        "load": load,
        "ambient": ambient,
        "aux": aux,
        "y": y,
    }
    if nan_fraction > 0:
        for name in SYNTHETIC_NAN_FEATURES:
            series[name][rng.random(length) < nan_fraction] = np.nan
    return series


def _regime_multiplier(rng: np.random.Generator, spec: StratumSpec, length: int) -> np.ndarray:
    """`[length]` piecewise-constant amplitude multiplier (switches at random times)."""
    if len(spec.regimes) == 1:
        return np.full(length, spec.regimes[0])
    num_switches = int(rng.poisson(length / spec.regime_steps))
    switch_at = np.sort(rng.integers(1, max(length, 2), size=num_switches))
    choices = np.asarray(spec.regimes)[rng.integers(len(spec.regimes), size=num_switches + 1)]
    return choices[np.searchsorted(switch_at, np.arange(length), side="right")]


def _smoothed_noise(rng: np.random.Generator, length: int, memory: float) -> np.ndarray:
    """`[length]` unit-variance exponential moving average of white noise."""
    if memory <= 0:
        return rng.standard_normal(length)
    taps = max(1, math.ceil(math.log(0.01) / math.log(memory)))
    kernel = memory ** np.arange(taps)
    kernel /= np.sqrt((kernel**2).sum())
    return np.convolve(rng.standard_normal(length + taps - 1), kernel, mode="valid")


def _smooth_process(rng: np.random.Generator, clock: np.ndarray, period: float) -> np.ndarray:
    """`[len(clock)]` smooth, roughly unit-variance process varying over 3-30 periods."""
    num_waves = 3
    wavelengths = rng.uniform(3.0 * period, 30.0 * period, num_waves)
    offsets = rng.uniform(0.0, 2 * np.pi, num_waves)
    waves = np.sin(2 * np.pi * clock[None, :] / wavelengths[:, None] + offsets[:, None])
    return np.sqrt(2.0 / num_waves) * waves.sum(axis=0)


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
    parser.add_argument("--time-kind", choices=("int", "timestamp"), default="int")
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
        "--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar"
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
    print(summary)
    return 0
