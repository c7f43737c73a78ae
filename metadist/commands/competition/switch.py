"""Whether another experiment wins a group clearly enough to replace the run's own.

A group's candidates of the run's own experiment (its losses, lengths, heads and
lookbacks) are chosen among by their validation score alone. Another experiment
(`--experiment-candidates`) is another model: two trainings of one recipe differ on a
validation window by more than many of the margins it wins by, and a switch on such a
margin does not carry to the holdout. So the best other experiment replaces the best of
the run's own only where it is better by more than `margin` standard errors of the
difference (`--experiment-margin`, 2 by default; 0: the lowest score, as the other
candidates): the difference of the two pooled validation scores, over the series both
score, with its standard error from how the difference varies between those series
(`paired_difference`). The test is recorded in `choices.json` (`switch`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from metadist.commands.competition.guard import read_points
from metadist.eval.metrics import point_terms

# --experiment-margin's default: standard errors of the difference another experiment wins by
DEFAULT_MARGIN = 2.0


def task_sums(run_dir: Path, method: str, metric: str) -> dict[str, tuple[float, int]]:
    """Each task's sum of `metric`'s point terms of `method`'s forecasts and its number of
    points, for the tasks whose every term is finite (as the pooled score counts them)."""
    points = read_points(run_dir, method)
    terms = point_terms(metric, points["truth"], points["model"], points["scale"])
    tasks, index = np.unique(points["task"], return_inverse=True)
    sums = np.bincount(index, weights=np.where(np.isfinite(terms), terms, 0.0))
    bad = np.bincount(index, weights=(~np.isfinite(terms)).astype(np.float64)) > 0
    counts = np.bincount(index)
    return {
        str(t): (float(s), int(n))
        for t, s, n, b in zip(tasks, sums, counts, bad, strict=True)
        if not b
    }


def paired_difference(
    own: dict[str, tuple[float, int]], other: dict[str, tuple[float, int]]
) -> tuple[float, float, int]:
    """`(difference, standard error, tasks)`: the pooled score of the task sums `own`
    minus that of `other` (`task_sums`) over the tasks both have, and its standard error
    from the spread of the tasks' differences (the ratio estimator's: a task of more
    points weighs more). The error is NaN for fewer than two common tasks."""
    common = sorted(set(own) & set(other))
    if not common:
        return float("nan"), float("nan"), 0
    diff = np.array([own[t][0] - other[t][0] for t in common], np.float64)
    counts = np.array([own[t][1] for t in common], np.float64)
    total = counts.sum()
    difference = float(diff.sum() / total)
    k = len(common)
    if k < 2:
        return difference, float("nan"), k
    residuals = diff - difference * counts
    error = float(np.sqrt(k / (k - 1) * np.sum(residuals**2)) / total)
    return difference, error, k


def switch_test(
    own: tuple[Path, str], other: tuple[Path, str], metric: str, margin: float
) -> dict[str, Any]:
    """Whether the other experiment's evaluated run `other` (`(run_dir, method)`) wins
    against the best of the run's own, `own`, by more than `margin` standard errors of
    their paired `metric` difference (`switched`); the figures that decided it."""
    difference, error, tasks = paired_difference(task_sums(*own, metric), task_sums(*other, metric))
    decisive = np.isfinite(difference) and np.isfinite(error)
    switched = bool(decisive and difference > margin * error)
    return {
        "difference": difference,
        "standard_error": error,
        "tasks": tasks,
        "margin": margin,
        "switched": switched,
    }


def describe_switch(test: dict[str, Any]) -> str:
    """A printed clause on a group's test of another experiment."""
    verdict = "chosen" if test["switched"] else "the run's own kept"
    return (
        f"; {test['candidate']} against {test['against']}: better by "
        f"{test['difference']:.3f} (standard error {test['standard_error']:.3f}, "
        f"margin {test['margin']:g}): {verdict}"
    )
