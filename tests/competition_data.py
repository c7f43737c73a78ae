"""A small forecasting-competition data set in the long format `metadist competition` reads."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from metadist.api.artifact import write_periods
from metadist.store.ingest import ingest

# label: (horizon, period, number of series, shortest and longest training part)
LABELS = {
    "ANNUAL": (4, 1, 10, 9, 20),
    "WEEKLY": (13, 1, 8, 30, 60),
    "MONTHLY": (24, 12, 10, 40, 90),
}


def write_competition(out: Path, seed: int = 0, columns: dict[str, str] | None = None) -> Path:
    """`out/train.parquet` and `out/test.parquet`: seasonal trending series, categories
    RETAIL and ENERGY plus SOLO (one series), some values <= 0 (ENERGY), some series
    shorter than a task of their horizon. `columns` renames the default columns."""
    rng = np.random.default_rng(seed)
    names = {"series_id": "series_id", "t": "t", "value": "value", "category": "category"}
    names.update({"frequency": "frequency", "horizon": "horizon", "period": "period"})
    names.update(columns or {})
    rows: dict[str, list] = {"train": [], "test": []}
    number = 0
    for label, (horizon, period, count, shortest, longest) in LABELS.items():
        for i in range(count):
            number += 1
            category = (
                "SOLO" if (label, i) == ("WEEKLY", 0) else ("ENERGY" if i % 3 == 0 else "RETAIL")
            )
            n = int(rng.integers(shortest, longest + 1))
            t = np.arange(n + horizon)
            season = np.sin(2 * np.pi * t / period) if period > 1 else 0.0
            level = 5.0 if category == "ENERGY" else 100.0
            values = level + 0.3 * t + 3.0 * season + rng.normal(0, 1.0, len(t))
            if category == "ENERGY":
                values = values - 8.0  # crosses zero
            for step, value in zip(t, values, strict=True):
                part = "train" if step < n else "test"
                rows[part].append(
                    (f"S{number:03d}", int(step), float(value), category, label, horizon, period)
                )
    out.mkdir(parents=True, exist_ok=True)
    keys = ["series_id", "t", "value", "category", "frequency", "horizon", "period"]
    for part, records in rows.items():
        table = pa.table({names[k]: [r[j] for r in records] for j, k in enumerate(keys)})
        pq.write_table(table, out / f"{part}.parquet")
    return out


def write_yearly_history(run: Path, histories: dict[str, list[float]]) -> None:
    """A fake run's training data: `run/store` ingested from the series `histories`
    (yearly, label column `frequency`), named in `run/config.yaml`, period 1 recorded."""
    rows = [(k, t, v) for k, values in histories.items() for t, v in enumerate(values)]
    frame = pd.DataFrame(rows, columns=["series_id", "t", "value"]).assign(frequency="yearly")
    frame.to_parquet(run / "history.parquet")
    ingest(
        run / "history.parquet", run / "store", entity_col="series_id", time_col="t",
        features=["value"], targets=["value"], label_col="frequency", scaling="none",
        progress=False,
    )  # fmt: skip
    (run / "config.yaml").write_text(f"data:\n  store: {run / 'store'}\n")
    write_periods(run, 1)


def write_quarterly(data: Path, series: int, length: int, metric: str) -> Path:
    """`data/`: `series` quarterly series (trend, season, noise) of `length` training
    values and a holdout of 4, scored by `metric`."""
    rng = np.random.default_rng(0)
    rows: dict[str, list] = {"train": [], "test": []}
    for i in range(series):
        t = np.arange(length + 4)
        values = 50 + 0.3 * t + 4 * np.sin(2 * np.pi * t / 4) + rng.normal(0, 1, len(t))
        for step, value in zip(t, values, strict=True):
            part = "train" if step < length else "test"
            rows[part].append((f"Q{i}", int(step), float(value)))
    data.mkdir(parents=True)
    for part, records in rows.items():
        frame = pd.DataFrame(records, columns=["series_id", "t", "value"])
        frame.assign(frequency="Q", horizon=4, period=4).to_parquet(data / f"{part}.parquet")
    (data / "competition.yaml").write_text(f"stratum_col: null\nmetric: {metric}\n")
    return data


def competition_runner(arguments: list[str], timeout: int) -> Callable[..., str]:
    """A function running `metadist competition ARGUMENTS EXTRA...` (its `extra`) in a
    process from the repository root, one thread each, no wandb; it returns the output
    and fails the test where the command fails."""
    command = [sys.executable, "-m", "metadist.cli", "competition", *arguments]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    root = Path(__file__).resolve().parents[1]

    def run(*extra: str) -> str:
        done = subprocess.run(
            [*command, *extra], cwd=root, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    return run
