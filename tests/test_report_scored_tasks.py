"""The main table says on how many tasks a metric is defined where that is fewer than the
tasks scored: its mean is over those alone, not comparable with the other columns'."""

import numpy as np

from metadist.eval import metrics
from metadist.eval.report import markdown_report
from metadist.eval.task_scores import TaskScores, group_summaries, overall_summary


def _result(zero_truth_tasks):
    """Five forecast tasks of two methods, a zero in the truth of `zero_truth_tasks`
    (MAPE is undefined there)."""
    methods = {"naive": "naive (last value)", "theta": "Theta method"}
    scores = TaskScores(methods, metrics.POINT_METRICS)
    rng = np.random.default_rng(0)
    for task in range(5):
        truth = rng.uniform(1.0, 2.0, (4, 1))
        if task in zero_truth_tasks:
            truth[1] = 0.0
        sums = {}
        for method in methods:
            forecast = truth + rng.normal(0.0, 0.1, truth.shape)
            sums[method] = {
                k: float(metrics.point_terms(k, truth, forecast, np.ones_like(truth)).sum())
                for k in metrics.POINT_METRICS
            }
        scores.add(sums, truth.size, {"stratum": "ab"[task % 2]})
    return {
        "title": "t",
        "kind": "forecast",
        "num_tasks": scores.num_tasks,
        "methods": methods,
        "metrics": list(metrics.POINT_METRICS),
        "primary_metric": "smape",
        "overall": overall_summary(scores, False),
        "groups": group_summaries(scores, {"stratum": "stratum"}),
    }


def test_a_metric_defined_on_fewer_tasks_says_so_in_the_main_table():
    result = _result(zero_truth_tasks={0, 3})
    assert result["overall"]["naive"]["mape"]["num_tasks"] == 3
    header = markdown_report(result).splitlines()[2]
    assert "| MAPE (3 of 5 tasks) |" in header, header
    assert "| sMAPE |" in header and "| MASE |" in header, header  # defined on every task
    # the group tables gave the count already; they still do
    assert "| **all** | 3 |" in markdown_report(result)


def test_a_metric_defined_on_every_task_has_its_plain_heading():
    header = markdown_report(_result(zero_truth_tasks=set())).splitlines()[2]
    assert header.startswith("| method | sMAPE | sMAPE, mean per series | MAPE | MASE |"), header
