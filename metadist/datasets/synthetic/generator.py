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

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

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
SYNTHETIC_INGEST_ARGS: dict[str, Any] = {
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
