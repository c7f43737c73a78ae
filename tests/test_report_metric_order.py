"""The tables put the data set's own metric (eval.primary_metric) first."""

from __future__ import annotations

from metadist.eval.report import markdown_report, metric_table


def _result(primary: str) -> dict:
    metrics = ["smape", "mape", "mase"]
    values = {"smape": 20.0, "mape": 30.0, "mase": 1.5}
    score = {
        m: {"value": v, "ci95": 0.5, "task_mean": v + 1, "num_tasks": 4} for m, v in values.items()
    }
    return {
        "kind": "forecast",
        "metrics": metrics,
        "primary_metric": primary,
        "primary_metric_label": {"mape": "MAPE", "smape": "sMAPE"}[primary],
        "methods": {"adapted": "meta-trained + adapted"},
        "overall": {"adapted": score},
        "references": {"Theta": {"all": 31.0}},
    }


def test_primary_metric_is_the_first_column_with_its_per_series_mean_beside_it():
    header, _, row, reference = metric_table(_result("mape")).splitlines()
    assert header == "| method | MAPE | MAPE, mean per series | sMAPE | MASE |"
    assert (
        row == "| meta-trained + adapted | 30.00 ± 0.500 | 31.00 | 20.00 ± 0.500 | 1.500 ± 0.500 |"
    )
    # the published figure sits under the primary metric, nothing under the others
    assert reference == "| Theta (published) | 31.00 |  |  |  |"


def test_smape_primary_keeps_the_recorded_order():
    header = metric_table(_result("smape")).splitlines()[0]
    assert header == "| method | sMAPE | sMAPE, mean per series | MAPE | MASE |"


def test_the_markdown_report_opens_with_the_primary_metric():
    text = markdown_report(_result("mape"))
    assert "| method | MAPE |" in text


def test_an_interval_of_rounding_noise_reads_as_zero():
    from metadist.eval.report import _format_score

    assert _format_score({"value": 0.3333333, "ci95": 2.496e-17}) == "0.333 ± 0"
    assert _format_score({"value": 0.5, "ci95": 0.012}) == "0.500 ± 0.012"
    assert _format_score({"value": 1e6, "ci95": 5e-4}) == "1.000e+06 ± 0"
