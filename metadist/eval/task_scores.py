"""Per-task scores of every method, with divergence counts, and their summaries.

`TaskScores` holds each task's point sums of each metric for each method (one row per task,
as `tasks.parquet` keeps them); a method whose prediction diverged on a task (`diverged`)
is counted as such, never averaged in. `overall_summary` and `group_summaries` pool them
into the report's tables (`metadist.eval.combine` pools the rows of several runs alike).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from metadist.eval import metrics

_DIVERGED = "diverged"
# A prediction diverged when it is not finite, or larger in magnitude than this many times
# the largest value the method was given for the task (its history or support targets):
# an exploding inner loop, not a forecast.
DIVERGENCE_FACTOR = 1e6


def diverged(prediction: np.ndarray, reference: np.ndarray | float) -> bool:
    """Whether one task's `prediction` is non-finite or exploding relative to
    `reference` (the values the method saw: history or support targets)."""
    prediction = np.asarray(prediction, dtype=np.float64)
    if not np.isfinite(prediction).all():
        return True
    scale = reference_scale(reference)
    return bool(np.abs(prediction).max(initial=0.0) > DIVERGENCE_FACTOR * _floored(scale))


def reference_scale(reference: np.ndarray | float) -> float:
    """The largest magnitude of the values a method saw (0 for none), which a prediction
    that does not diverge stays within `DIVERGENCE_FACTOR` times of."""
    return float(np.nanmax(np.abs(reference))) if np.size(reference) else 0.0


def diverged_rows(predictions: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """`[B]` `diverged` of each task's prediction `predictions[b]` (`[B, ...]`), given
    the `reference_scale` of each task's values `scales [B]`."""
    flat = np.asarray(predictions, dtype=np.float64).reshape(len(scales), -1)
    finite = np.isfinite(flat)
    largest = np.abs(np.where(finite, flat, 0.0)).max(axis=1, initial=0.0)
    return ~finite.all(axis=1) | (largest > DIVERGENCE_FACTOR * _floored(scales))


def _floored(scales):
    """A reference of 0 (a history of zeros: an intermittent or new series) is taken as
    1, so that a forecast of 0.01 after it is not an explosion; any other is itself."""
    return np.where(np.asarray(scales, dtype=np.float64) > 0, scales, 1.0)


class TaskScores:
    """Per-task point sums of each metric, for each method, and the tasks' groups
    (`table` / `from_table`: one row per task, as `tasks.parquet` holds them)."""

    def __init__(self, methods: Iterable[str], metric_names: Iterable[str]) -> None:
        self.methods = list(methods)
        self.metric_names = list(metric_names)
        self.sums: dict[str, dict[str, list[float]]] = {
            m: {k: [] for k in self.metric_names} for m in self.methods
        }
        self.diverged: dict[str, list[bool]] = {m: [] for m in self.methods}
        self.counts: list[int] = []
        self.groups: dict[str, list[str]] = {}
        # Every forecast point (forecasting on a store): entity, groups, step, target,
        # truth and each method's forecast, one row each (`forecasts.parquet`).
        self.points: dict[str, list] = {}

    def add_points(
        self,
        groups: dict[str, str],
        truth: np.ndarray,
        forecasts: dict[str, np.ndarray],
    ) -> None:
        """Records one task's forecast points: `truth [h, T]`, `forecasts {method: [h, T]}`."""
        h, num_targets = truth.shape
        columns = {
            **{name: [value] * truth.size for name, value in groups.items()},
            "step": np.repeat(np.arange(h), num_targets).tolist(),
            "target": np.tile(np.arange(num_targets), h).tolist(),
            "truth": truth.reshape(-1).tolist(),
            **{m: np.asarray(forecasts[m], np.float64).reshape(-1).tolist() for m in self.methods},
        }
        for name, values in columns.items():
            self.points.setdefault(name, []).extend(values)

    def add(
        self,
        sums: dict[str, dict[str, float]],
        count: int,
        groups: dict[str, str],
        diverged: dict[str, bool] | None = None,
    ):
        """Adds one task: each method's metric sums over its `count` points, its groups,
        and which methods diverged on it (their sums are then not used)."""
        for method in self.methods:
            failed = bool((diverged or {}).get(method, False))
            self.diverged[method].append(failed)
            for name in self.metric_names:
                self.sums[method][name].append(float("nan") if failed else sums[method][name])
        self.counts.append(count)
        for grouping, value in groups.items():
            self.groups.setdefault(grouping, []).append(value)

    @property
    def num_tasks(self) -> int:
        return len(self.counts)

    def table(self, groupings: dict[str, str]) -> dict[str, list]:
        """Columns of one row per task: `num_points`, `group:<name>` for each grouping
        (`{grouping: name}`), and `<method>:<metric>` point sums; see `from_table`."""
        columns: dict[str, list] = {"num_points": list(self.counts)}
        for grouping, name in groupings.items():
            if grouping in self.groups:
                columns[f"group:{name}"] = list(self.groups[grouping])
        for method in self.methods:
            for metric in self.metric_names:
                columns[f"{method}:{metric}"] = list(self.sums[method][metric])
            columns[f"{method}:{_DIVERGED}"] = list(self.diverged[method])
        return columns

    @classmethod
    def from_table(cls, columns: dict[str, list]) -> TaskScores:
        """The scores of a `table`, its groups keyed by their names."""
        pairs = [
            key.split(":", 1) for key in columns if ":" in key and not key.startswith("group:")
        ]
        methods = list(dict.fromkeys(method for method, _ in pairs))
        scores = cls(methods, dict.fromkeys(metric for _, metric in pairs if metric != _DIVERGED))
        for method, metric in pairs:
            if metric == _DIVERGED:
                scores.diverged[method] = [bool(v) for v in columns[f"{method}:{metric}"]]
            else:
                scores.sums[method][metric] = [float(v) for v in columns[f"{method}:{metric}"]]
        scores.counts = [int(v) for v in columns["num_points"]]
        for method in methods:  # tables written before divergence was recorded
            if len(scores.diverged[method]) != len(scores.counts):
                scores.diverged[method] = [False] * len(scores.counts)
        scores.groups = {
            key[len("group:") :]: [str(v) for v in values]
            for key, values in columns.items()
            if key.startswith("group:")
        }
        return scores

    def summary(self, keep: np.ndarray | None = None) -> dict[str, dict[str, dict[str, float]]]:
        counts = np.asarray(self.counts, dtype=np.float64)
        keep = np.ones(len(counts), dtype=bool) if keep is None else keep
        out: dict[str, dict[str, dict[str, float]]] = {}
        for method in self.methods:
            out[method] = {}
            num_diverged = int(np.asarray(self.diverged[method], dtype=bool)[keep].sum())
            for name in self.metric_names:
                if num_diverged:
                    # Not averaged over the other tasks: that number would not be
                    # comparable with the other methods' (nor finite with them in it).
                    out[method][name] = {
                        "value": float("nan"),
                        "task_mean": float("nan"),
                        "ci95": float("nan"),
                        "num_tasks": int(keep.sum()),
                        "num_diverged": num_diverged,
                    }
                    continue
                sums = np.asarray(self.sums[method][name], dtype=np.float64)[keep]
                per_task = sums / counts[keep]
                finite = per_task[~np.isnan(per_task)]
                value = metrics.pool(sums, counts[keep])
                half = metrics.mean_ci(finite)[1] if finite.size else float("nan")
                out[method][name] = {
                    "value": value,
                    "task_mean": float(finite.mean()) if finite.size else float("nan"),
                    "ci95": half,
                    "num_tasks": int(finite.size),
                    "num_diverged": 0,
                }
        if self.has_owa:
            for method in self.methods:
                out[method]["owa"] = _owa(out[method], out["naive2"])
        return out

    @property
    def has_owa(self) -> bool:
        """Whether OWA can be derived: naive 2 scored, with sMAPE and MASE."""
        return "naive2" in self.methods and {"smape", "mase"} <= set(self.metric_names)

    def num_diverged(self) -> dict[str, int]:
        """`{method: tasks on which it diverged}`, for the methods that did."""
        counts = {m: int(sum(flags)) for m, flags in self.diverged.items()}
        return {m: n for m, n in counts.items() if n}


def _owa(scores: dict[str, dict[str, float]], naive2: dict[str, dict[str, float]]) -> dict:
    """OWA (M4): ½·(sMAPE / sMAPE of naive 2 + MASE / MASE of naive 2), of the pooled
    values, and of the per-series means; not finite where either ratio is undefined."""
    out: dict[str, Any] = {"ci95": None, "num_tasks": scores["smape"]["num_tasks"]}
    out["num_diverged"] = scores["smape"]["num_diverged"]
    for key in ("value", "task_mean"):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = 0.5 * (
                np.float64(scores["smape"][key]) / naive2["smape"][key]
                + np.float64(scores["mase"][key]) / naive2["mase"][key]
            )
        out[key] = float(ratio) if np.isfinite(ratio) else float("nan")
    return out


def overall_summary(scores: TaskScores, classification: bool) -> dict[str, Any]:
    """`scores.summary()` of all tasks; accuracy (classification) is averaged over tasks."""
    overall = scores.summary()
    if classification:
        for method in scores.methods:
            score = overall[method]["accuracy"]
            score["value"] = score["task_mean"]
    return overall


def group_summaries(scores: TaskScores, groupings: dict[str, str]) -> dict[str, Any]:
    """`{name: {group value: {num_tasks, num_scored: {metric: tasks}, scores: {method:
    {metric: value}}}}}` for each
    `{grouping: name}` of `groupings` that splits the tasks into at least two groups."""
    out: dict[str, Any] = {}
    for grouping, name in groupings.items():
        if grouping not in scores.groups:
            continue
        values = np.asarray(scores.groups[grouping])
        names = sorted(set(values.tolist()) - {""})
        if len(names) < 2:
            continue
        table = {}
        for value in names:
            keep = values == value
            summary = scores.summary(keep)
            metric_names = next(iter(summary.values())).keys()
            table[value] = {
                "num_tasks": int(keep.sum()),
                # tasks each metric is defined on (MAPE needs a truth without zeros, MASE
                # a history that is not constant); the same for every method
                "num_scored": {
                    k: min(int(s[k]["num_tasks"]) for s in summary.values()) for k in metric_names
                },
                "scores": {m: {k: v["value"] for k, v in s.items()} for m, s in summary.items()},
                "diverged": {
                    m: next(iter(s.values()))["num_diverged"]
                    for m, s in summary.items()
                    if next(iter(s.values()))["num_diverged"]
                },
            }
        out[name] = table
    return out
