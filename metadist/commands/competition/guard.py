"""The model shrunk towards seasonal naive by each group's validation weight, scored on
a test run's holdout beside the model alone and seasonal naive (`OUT/guarded.md`,
`guarded.json`).

The weight of each group was chosen on the validation protocol (`choice.py`); here it
is only applied. The scores pool forecast points as the evaluation's tables do
(`metadist.eval.fallback_combination.pooled_score`), by label and over every group.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from metadist.durable import atomic_write_text
from metadist.eval.fallback_combination import pooled_score, shrunk
from metadist.eval.metrics import point_terms
from metadist.eval.report import EVAL_DIR, FORECASTS_NAME, TASKS_NAME

# the method a model is shrunk towards
FALLBACK = "seasonal_naive"
GUARDED_FILE = "guarded.md"
# the metrics of the table, after the data set's own
_METRICS = ("smape", "mape", "mase")


def read_points(run_dir: Path, method: str) -> dict[str, np.ndarray]:
    """Every forecast point of an evaluated run: `truth`, `model` (its `method`),
    `fallback` (seasonal naive), `task` (the entity), `label` where the run has the
    column `label`, and `scale` (MASE's scale of the point's task, from the fallback's
    sums: its absolute error over its scaled one; NaN where undefined).

    Raises:
        FileNotFoundError: the run kept no forecast points.
        ValueError: the run did not score `method` or the fallback.
    """
    path = run_dir / EVAL_DIR / FORECASTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the evaluation kept no forecast points")
    points = pd.read_parquet(path)
    missing = [m for m in (method, FALLBACK, "truth", "entity") if m not in points.columns]
    if missing:
        raise ValueError(f"{path} has no column {missing[0]!r}")
    tasks = pd.read_parquet(run_dir / EVAL_DIR / TASKS_NAME)
    with np.errstate(divide="ignore", invalid="ignore"):
        scales = tasks[f"{FALLBACK}:mae"].to_numpy() / tasks[f"{FALLBACK}:mase"].to_numpy()
    by_task = dict(zip(tasks["group:entity"].astype(str), scales, strict=True))
    task = points["entity"].astype(str).to_numpy()
    return {
        "truth": points["truth"].to_numpy(np.float64),
        "model": points[method].to_numpy(np.float64),
        "fallback": points[FALLBACK].to_numpy(np.float64),
        "task": task,
        "scale": np.array([by_task.get(t, np.nan) for t in task], np.float64),
        "label": points[label_column(points)].astype(str).to_numpy(),
    }


def label_column(points: pd.DataFrame) -> str:
    """The label column of a forecasts table: the one after the groups it starts with,
    before `entity` (the stratum's comes first where there is one)."""
    columns = list(points.columns)
    groups = columns[: columns.index("entity")] if "entity" in columns else []
    return groups[-1] if groups else "entity"


def guarded_scores(
    runs: Sequence[tuple[Path, str, float]], metric: str
) -> dict[str, dict[str, dict[str, float]]]:
    """`{label or "all": {row: {metric: score}}}` of the groups' evaluated `runs`
    (run, its model's method, the validation weight), rows `model`, `guarded`,
    `seasonal_naive`, metrics the data set's `metric` first."""
    parts = []
    for run_dir, method, weight in runs:
        points = read_points(run_dir, method)
        points["guarded"] = shrunk(points["model"], points["fallback"], weight)
        parts.append(points)
    joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    wanted = list(dict.fromkeys([metric, *_METRICS]))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label in [*dict.fromkeys(joined["label"]), "all"]:
        rows = np.ones(len(joined["truth"]), bool) if label == "all" else joined["label"] == label
        out[label] = {
            row: {
                m: pooled_score(
                    point_terms(m, joined["truth"][rows], joined[key][rows], joined["scale"][rows]),
                    joined["task"][rows],
                )
                for m in wanted
            }
            for row, key in (("model", "model"), ("guarded", "guarded"), (FALLBACK, "fallback"))
        }
    return out


def write_guarded(
    out: Path, runs: Sequence[tuple[Path, str, float]], metric: str, weights: dict[str, float]
) -> str:
    """Writes `OUT/guarded.md` and `guarded.json` (the scores of `guarded_scores` and
    the `weights` by group) and returns the table."""
    scores = guarded_scores(runs, metric)
    metrics = list(next(iter(scores["all"].values())))
    header = "| label | " + " | ".join(
        f"{row} {m}" for m in metrics for row in ("model", "guarded", "snaive")
    )
    lines = [
        "# The model shrunk towards seasonal naive by its validation weight",
        "",
        "weights by group: " + ", ".join(f"H={k}: {w:.1f}" for k, w in weights.items()),
        "",
        header + " |",
        "| --- |" + " ---: |" * (3 * len(metrics)),
    ]
    for label, rows in scores.items():
        cells = [f"{rows[row][m]:.3f}" for m in metrics for row in ("model", "guarded", FALLBACK)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    atomic_write_text(out / GUARDED_FILE, table)
    document: dict[str, Any] = {"metric": metric, "weights": weights, "scores": scores}
    atomic_write_text(out / "guarded.json", json.dumps(document, indent=1) + "\n")
    return table
