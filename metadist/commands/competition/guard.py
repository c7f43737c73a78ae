"""What a validation run chose to keep the model plausible, applied on a test run's
holdout and scored beside the model unguarded and seasonal naive (`OUT/guarded.md`,
`guarded.json`): the model clipped to its series' own history's band
(`metadist.eval.plausibility`, width per group; the model as reported), and that model
shrunk towards seasonal naive by the group's weight.

Both were chosen on the validation protocol (`choice.py`); here they are only applied,
and each group's evaluated run records its band width (`guard.json`) so that
`load_run(...).forecast` serves the same guarded model. The scores pool forecast points
as the evaluation's tables do (`metadist.eval.fallback_combination.pooled_score`), by
label and over every group.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from metadist.api.artifact import recorded_periods
from metadist.durable import atomic_write_text
from metadist.eval.fallback_combination import pooled_score, shrunk
from metadist.eval.metrics import point_terms
from metadist.eval.plausibility import guard_points, parse_width, width_label, write_guard
from metadist.eval.report import EVAL_DIR, FORECASTS_NAME, TASKS_NAME
from metadist.store.reader import SeriesStore

# the method a model is shrunk towards
FALLBACK = "seasonal_naive"
GUARDED_FILE = "guarded.md"
# the metrics of the table, after the data set's own
_METRICS = ("smape", "mape", "mase")
# the table's rows: their points' key in `read_points`'s dictionary, extended
ROWS = {"unguarded": "unguarded", "model": "model", "shrunk": "shrunk", FALLBACK: "fallback"}


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
    points = read_forecasts(run_dir)
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


def read_forecasts(run_dir: Path) -> pd.DataFrame:
    """An evaluated run's forecast points, each series' steps in order (a guard clips
    a series' points by their step).

    Raises:
        FileNotFoundError: the run kept no forecast points.
    """
    path = run_dir / EVAL_DIR / FORECASTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the evaluation kept no forecast points")
    points = pd.read_parquet(path)
    keys = [k for k in ("entity", "target", "step") if k in points.columns]
    return points.sort_values(keys, kind="stable").reset_index(drop=True) if keys else points


def read_histories(run_dir: Path) -> dict[str, np.ndarray]:
    """`{series: [N] float64}` the target history of every series in the store the run
    was trained on (its `config.yaml`'s `data.store`): what its forecasts start from.

    Raises:
        FileNotFoundError: the run has no config or its store is gone.
        ValueError: a config without `data.store`, or a store with more than one target.
    """
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{config}: the run has no config (is it a trained run?)")
    try:
        store_path = Path(yaml.safe_load(config.read_text())["data"]["store"])
    except (KeyError, TypeError, yaml.YAMLError):
        raise ValueError(f"{config} names no data.store") from None
    if not store_path.is_dir():
        raise FileNotFoundError(f"{store_path}: the store of run {run_dir} is gone")
    store = SeriesStore.open(store_path)
    targets = store.metadata["target_names"]
    if len(targets) != 1:
        raise ValueError(f"{store_path}: a guard needs one target, the store has {targets}")
    column = store.column_index(targets[0])[0]
    return {
        str(key): np.asarray(store.series(i)[:, column], np.float64)
        for i, key in enumerate(store.entity_ids)
    }


def guard_inputs(
    points: dict[str, np.ndarray], run_dir: Path
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`(histories, periods [P])`: every series' history the run saw (`read_histories`)
    and each point's seasonal period as the run records it (`periods.json`).

    Raises:
        ValueError: a run that records no period for a label it forecasts.
    """
    recorded = recorded_periods(run_dir)
    periods = np.ones(len(points["label"]), np.int64)
    for label in dict.fromkeys(points["label"].tolist()):
        period = recorded.get(label) if isinstance(recorded, dict) else recorded
        if period is None:
            raise ValueError(f"{run_dir} records no seasonal period for {label!r}")
        periods[points["label"] == label] = period
    return read_histories(run_dir), periods


def guarded_model(points: dict[str, np.ndarray], run_dir: Path, width: float | None) -> np.ndarray:
    """The points' model forecast clipped to each series' band at `width` (None: as it
    is; `guard_inputs` says from what)."""
    if width is None:
        return np.asarray(points["model"], np.float64).copy()
    histories, periods = guard_inputs(points, run_dir)
    return guard_points(points["model"], points["task"], histories, periods, width)


def label_column(points: pd.DataFrame) -> str:
    """The label column of a forecasts table: the one after the groups it starts with,
    before `entity` (the stratum's comes first where there is one)."""
    columns = list(points.columns)
    groups = columns[: columns.index("entity")] if "entity" in columns else []
    return groups[-1] if groups else "entity"


def guarded_scores(
    runs: Sequence[tuple[Path, str, float]],
    metric: str,
    widths: Sequence[float | None] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """`{label or "all": {row: {metric: score}}}` of the groups' evaluated `runs`
    (run, its model's method, the validation weight) and their band `widths` (None: no
    guard), rows `unguarded` (the model alone), `model` (within its band: the model as
    reported), `shrunk` (that model towards seasonal naive by the weight) and
    `seasonal_naive`, metrics the data set's `metric` first."""
    parts = []
    for number, (run_dir, method, weight) in enumerate(runs):
        points = read_points(run_dir, method)
        width = None if widths is None else widths[number]
        points["unguarded"] = points["model"]
        points["model"] = guarded_model(points, run_dir, width)
        points["shrunk"] = shrunk(points["model"], points["fallback"], weight)
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
            for row, key in ROWS.items()
        }
    return out


def chosen_widths(out: Path, keys: Sequence[str]) -> list[float | None]:
    """Each group's band width as `OUT/choices.json` records it (None: no guard, or a
    choice made before guards were chosen)."""
    path = out / "choices.json"
    groups = json.loads(path.read_text())["groups"] if path.is_file() else {}
    return [parse_width(groups.get(key, {}).get("guard")) for key in keys]


def write_guarded(
    out: Path, runs: Sequence[tuple[Path, str, float]], metric: str, weights: dict[str, float]
) -> str:
    """Writes `OUT/guarded.md` and `guarded.json` (the scores of `guarded_scores`, the
    `weights` and band widths by group, those from `OUT/choices.json`), records each
    group's width in its evaluated run (`guard.json`, for `load_run(...).forecast`), and
    returns the table."""
    widths = chosen_widths(out, list(weights))
    for (run_dir, method, _), width in zip(runs, widths, strict=True):
        write_guard(run_dir, width, str(out / "choices.json"), model=method)
    scores = guarded_scores(runs, metric, widths)
    metrics = list(next(iter(scores["all"].values())))
    bands = ", ".join(f"H={k}: {width_label(w)}" for k, w in zip(weights, widths, strict=True))
    lines = [
        "# The model within its history's band, and shrunk towards seasonal naive",
        "",
        f"band widths by group (validation): {bands}",
        "weights by group (validation): "
        + ", ".join(f"H={k}: {w:.1f}" for k, w in weights.items()),
        "",
        "| label | forecast | " + " | ".join(metrics) + " |",
        "| --- | --- |" + " ---: |" * len(metrics),
    ]
    names = {
        "unguarded": "model, unguarded (adaptation as chosen on validation)",
        "model": "model, guarded as chosen on validation",
        "shrunk": "model, guarded and shrunk by the weight chosen on validation",
    }
    for label, rows in scores.items():
        for row, values in rows.items():
            cells = " | ".join(f"{values[m]:.3f}" for m in metrics)
            lines.append(f"| {label} | {names.get(row, row)} | {cells} |")
    table = "\n".join(lines) + "\n"
    atomic_write_text(out / GUARDED_FILE, table)
    document: dict[str, Any] = {
        "metric": metric,
        "weights": weights,
        "guards": {k: width_label(w) for k, w in zip(weights, widths, strict=True)},
        "scores": scores,
    }
    atomic_write_text(out / "guarded.json", json.dumps(document, indent=1) + "\n")
    _point_to_guarded(out)
    return table


def _point_to_guarded(out: Path) -> None:
    """Adds to `OUT/metrics.md` (where it is) one line saying that its model row is
    unguarded and where the model as validation chose it, guarded, is scored."""
    metrics = out / "metrics.md"
    if not metrics.is_file():
        return
    text = metrics.read_text()
    line = (
        f"The model rows above are unguarded; {GUARDED_FILE} scores the model guarded "
        "(and shrunk) as chosen on validation, which `load_run(...).forecast` serves."
    )
    if line not in text:
        atomic_write_text(metrics, text.rstrip("\n") + "\n\n" + line + "\n")
