"""Whether another experiment wins a group clearly enough to replace the run's own.

A group's candidates of the run's own experiment (its losses, lengths, heads and
lookbacks) are chosen among by their validation score alone. Another experiment
(`--experiment-candidates`) is another model, and on M3 and M1 the switches it won by
small validation margins lost on the holdout while the large ones held. So the best
other experiment replaces the best of the run's own only where it is better by more than
`margin` standard errors of the difference (`--experiment-margin`, 2 by default; 0: the
lowest score, as the other candidates): the difference of the two pooled validation
scores over the series both score, its standard error from how the difference varies
between those series (`paired_difference`). That error counts the series' spread, not
a second training's noise (no second training is made), and it does not allow for the
two being the best of several candidates each; a margin of two errors asks for a win
well clear of the first. The test is recorded in `choices.json` (`switch`) where the
other experiment scores better and the margin is above 0; where none of the run's own
candidates has a finite score, the best other one is taken without a test, and where
fewer than two series are scored by both, no error can be estimated and the run's own is
kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from metadist.commands.competition.guard import read_points
from metadist.eval.fallback_combination import task_point_sums
from metadist.eval.metrics import point_terms

# --experiment-margin's default: standard errors of the difference another experiment wins by
DEFAULT_MARGIN = 2.0


def task_sums(run_dir: Path, method: str, metric: str) -> dict[str, tuple[float, int]]:
    """Each task's sum of `metric`'s point terms of `method`'s forecasts and its number of
    points, for the tasks whose every term is finite (as the pooled score counts them).

    Raises:
        FileNotFoundError: the run kept no forecast points.
        ValueError: the run did not score `method`, or `metric` is not a point metric.
    """
    points = read_points(run_dir, method)
    terms = point_terms(metric, points["truth"], points["model"], points["scale"])
    names, sums, counts = task_point_sums(terms, points["task"])
    return {
        str(t): (float(s), int(n))
        for t, s, n in zip(names, sums, counts, strict=True)
        if np.isfinite(s)
    }


def paired_difference(
    own: dict[str, tuple[float, int]], other: dict[str, tuple[float, int]]
) -> tuple[float, float, int]:
    """`(difference, standard error, num_tasks)`: the pooled score of the task sums `own`
    minus that of `other` (`task_sums`) over the `num_tasks` tasks both have, and the
    difference's standard error from how it varies between those tasks (each pooled
    score a ratio of sums, linearised: a task of more points weighs more). The error is
    NaN for fewer than two common tasks, the difference too for none."""
    common = sorted(set(own) & set(other))
    num_tasks = len(common)
    if not num_tasks:
        return float("nan"), float("nan"), 0
    own_sums, own_counts = np.array([own[t] for t in common], np.float64).T
    other_sums, other_counts = np.array([other[t] for t in common], np.float64).T
    own_score = own_sums.sum() / own_counts.sum()
    other_score = other_sums.sum() / other_counts.sum()
    difference = float(own_score - other_score)
    if num_tasks < 2:
        return difference, float("nan"), num_tasks
    residuals = (own_sums - own_score * own_counts) / own_counts.sum() - (
        other_sums - other_score * other_counts
    ) / other_counts.sum()
    error = float(np.sqrt(num_tasks / (num_tasks - 1) * np.sum(residuals**2)))
    return difference, error, num_tasks


def switch_test(
    own: tuple[Path, str], other: tuple[Path, str], metric: str, margin: float
) -> dict[str, Any]:
    """Whether the other experiment's evaluated run `other` (`(run_dir, method)`) wins
    against the best of the run's own, `own`, by more than `margin` standard errors of
    their paired `metric` difference (`switched`); the figures that decided it.

    Raises:
        FileNotFoundError: a run kept no forecast points.
        ValueError: a run did not score its method.
    """
    difference, error, num_series = paired_difference(
        task_sums(*own, metric), task_sums(*other, metric)
    )
    decisive = np.isfinite(difference) and np.isfinite(error)
    return {
        "difference": difference,
        "standard_error": error,
        "num_series": num_series,
        "margin": margin,
        "switched": bool(decisive and difference > margin * error),
    }


def describe_switch(test: dict[str, Any]) -> str:
    """A printed clause on a group's test of another experiment."""
    verdict = "chosen" if test["switched"] else "the run's own kept"
    return (
        f"; {test['candidate']} against {test['against']}: better by "
        f"{test['difference']:.3f} (standard error {test['standard_error']:.3f}, "
        f"margin {test['margin']:g}): {verdict}"
    )
