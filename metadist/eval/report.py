"""Writing an evaluation: `metrics.json`, `metrics.md`, `tasks.parquet` and `forecasts.png`
in `<run_dir>/eval/`.

The JSON holds everything (per-method metrics overall and per group, settings, published
reference figures); the markdown is the same numbers as tables a person reads; the PNG
shows a few query forecasts next to their history and truth. Every file is written to a
temporary name and renamed, so a report is never half-written.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from metadist.diskspace import check_writable, needs_space
from metadist.durable import atomic_file, atomic_write_text

METRIC_LABELS = {
    "smape": "sMAPE",
    "mape": "MAPE",
    "mase": "MASE",
    "owa": "OWA",
    "mae": "MAE",
    "mse": "MSE",
    "accuracy": "accuracy",
}
EVAL_DIR = "eval"
JSON_NAME = "metrics.json"
MARKDOWN_NAME = "metrics.md"
FIGURE_NAME = "forecasts.png"
# One row per task: its number of scored points, its groups (e.g. frequency, category,
# entity) and each method's sum of each metric over its points; pooling rows reproduces
# metrics.json, and `python -m metadist.eval.combine` pools the rows of several runs.
TASKS_NAME = "tasks.parquet"
# Every forecast point (forecasting on a store): entity, groups, step, target, truth and
# each method's forecast, so that any other metric can be computed later.
FORECASTS_NAME = "forecasts.parquet"
# Beside the primary metric, the per-group tables a forecasting competition reports: the
# scale-free metrics (M3's sMAPE, the MAPE of others, M4's MASE and OWA), where the
# evaluation has them.
GROUP_METRICS = ("smape", "mape", "mase", "owa")


def check_report_writable(run_dir: str | os.PathLike) -> None:
    """Refuses, before an evaluation is computed, a run whose report could not be written:
    `<run_dir>/eval/`, or the run directory where that does not exist yet (a run
    unpacked read-only, say).

    Raises:
        UnwritableError: naming the directory and the remedy.
    """
    out_dir = Path(run_dir) / EVAL_DIR
    check_writable(
        out_dir if out_dir.is_dir() else run_dir,
        "the evaluation report",
        "evaluate a writable copy of the run (cp -r), or make it writable; forecasting "
        "and classifying with the run write nothing into it",
    )


def write_report(
    result: dict[str, Any],
    run_dir: str | os.PathLike,
    examples: list[dict] | None = None,
    *,
    directory: str | os.PathLike | None = None,
    finish: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Path]:
    """Writes the JSON, the markdown tables, the per-task rows and (given examples) the figure.

    Args:
        result: the evaluation (see `metadist.eval.run.evaluate_run`).
        run_dir: the run directory; files go to `<run_dir>/eval/`.
        directory: write the files here instead (a combined evaluation).
        examples: forecasts to draw, each a dict with `title`, `history` `[n]`, `truth`
            `[H]` and one `[H]` array per drawn method (`unadapted`, `adapted`).
        finish: called with `result` after the per-task rows and the figure are written
            and before the JSON and markdown (which it may still change: the report's
            own time, `evaluate_run`).

    Returns:
        {"json": path, "markdown": path, "tasks": path (with `result["per_task"]`),
        "figure": path (only with examples)}.
    """
    out_dir = Path(directory) if directory is not None else Path(run_dir) / EVAL_DIR
    with needs_space(out_dir, "the evaluation report"):
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = {"json": out_dir / JSON_NAME, "markdown": out_dir / MARKDOWN_NAME}
        per_task = result.get("per_task")
        if per_task is not None:
            paths["tasks"] = out_dir / TASKS_NAME
            _atomic_write_table(paths["tasks"], per_task)
        if result.get("forecasts"):
            paths["forecasts"] = out_dir / FORECASTS_NAME
            _atomic_write_table(paths["forecasts"], result["forecasts"])
        if examples:
            paths["figure"] = out_dir / FIGURE_NAME
            plot_forecasts(examples, paths["figure"], title=result.get("title"))
        if finish is not None:
            finish(result)
        summary = {k: v for k, v in result.items() if k not in ("per_task", "paths", "forecasts")}
        _atomic_write_text(paths["json"], json.dumps(_jsonable(summary), indent=2) + "\n")
        _atomic_write_text(paths["markdown"], markdown_report(result))
    return paths


def markdown_report(result: dict[str, Any]) -> str:
    """The evaluation as markdown: a settings line, the main table, and per grouping a
    table of the primary metric (with the published references) and of each other
    scale-free metric (`GROUP_METRICS`)."""
    lines = [f"# {result.get('title', 'Meta-test evaluation')}", ""]
    settings = result.get("settings", {})
    if settings:
        lines.append("; ".join(f"{k}: {_plain(v)}" for k, v in settings.items()))
        lines.append("")
    lines += metric_table(result).splitlines()
    primary = result.get("primary_metric")
    extra = [m for m in GROUP_METRICS if m != primary and m in result.get("metrics", ())]
    for grouping, groups in result.get("groups", {}).items():
        lines += ["", f"## {result.get('primary_metric_label', 'sMAPE')} by {grouping}", ""]
        lines += group_table(result, grouping, groups).splitlines()
        for metric in extra:
            lines += ["", f"## {METRIC_LABELS[metric]} by {grouping}", ""]
            lines += group_table(result, grouping, groups, metric).splitlines()
    return "\n".join(lines) + "\n"


def metric_table(result: dict[str, Any]) -> str:
    """Rows: methods; columns: metrics, the primary metric (the data set's own) first, each
    `value ± 95% CI half-width over tasks`, and for forecasts the primary metric's mean of
    per-series errors next to its pooled mean over all points. A metric defined on fewer
    tasks than were scored (MAPE of a truth with a zero, MASE of a flat history) says on
    how many in its heading."""
    metrics = primary_first(result)
    methods = result["methods"]
    primary = str(result.get("primary_metric"))
    per_series = result.get("kind") in ("forecast", "regression") and primary in metrics
    labels = [_scored_label(result, m) for m in metrics]
    if per_series:
        labels.insert(1, f"{METRIC_LABELS.get(primary, primary)}, mean per series")
    header = "| method | " + " | ".join(labels) + " |"
    rule = "| --- | " + " | ".join("---:" for _ in labels) + " |"
    rows = [header, rule]
    for method, label in methods.items():
        scores = result["overall"][method]
        cells = [_format_score(scores[m]) for m in metrics]
        if per_series:
            score = scores[primary]
            cells.insert(1, _group_cell({**score, "value": score.get("task_mean")}))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    # published figures of the data set (of the primary metric), where they give one
    for name, reference in result.get("references", {}).items():
        if isinstance(reference, dict) and reference.get("all") is not None:
            cells = [_number(reference["all"]) if m == primary else "" for m in metrics]
            if per_series:
                cells.insert(1, "")
            rows.append(f"| {name} (published) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def primary_first(result: dict[str, Any]) -> list[str]:
    """The result's metrics in table order: the primary metric first, then the rest as
    recorded."""
    metrics = [str(m) for m in result["metrics"]]
    primary = result.get("primary_metric")
    return [primary, *(m for m in metrics if m != primary)] if primary in metrics else metrics


def group_table(
    result: dict[str, Any], grouping: str, groups: dict[str, Any], metric: str | None = None
) -> str:
    """Rows: groups and `all`; columns: task count, each method's `metric` (default: the
    primary metric) and, for the primary metric, each published reference (references are
    figures of the primary metric)."""
    primary = result["primary_metric"]
    metric = primary if metric is None else metric
    methods = result["methods"]
    references = {
        name: ref
        for name, ref in result.get("references", {}).items()
        if grouping in ref and metric == primary
    }
    header = (
        f"| {grouping} | tasks | "
        + " | ".join(methods.values())
        + "".join(f" | {name} (published)" for name in references)
        + " |"
    )
    rule = "| --- | ---: |" + " ---: |" * (len(methods) + len(references))
    rows = [header, rule]
    names = list(groups) + ["all"]
    for name in names:
        if name == "all":
            count = _num_scored(result, metric)
            cells = [_group_cell(result["overall"][m][metric]) for m in methods]
            refs = [_number(ref.get("all")) for ref in references.values()]
            name_cell = "**all**"
        else:
            count = groups[name].get("num_scored", {}).get(metric, groups[name]["num_tasks"])
            failed = groups[name].get("diverged", {})
            cells = [
                f"diverged ({failed[m]})"
                if failed.get(m)
                else _number(groups[name]["scores"][m][metric])
                for m in methods
            ]
            refs = [_number(ref[grouping].get(name)) for ref in references.values()]
            name_cell = name
        rows.append(f"| {name_cell} | {count} | " + " | ".join(cells + refs) + " |")
    return "\n".join(rows)


def _num_scored(result: dict[str, Any], metric: str) -> int | None:
    """The tasks `metric` is defined on (every method has the same); None where the
    result does not say."""
    total = result.get("num_tasks")
    counts = [result["overall"][m][metric].get("num_tasks", total) for m in result["methods"]]
    return min((c for c in counts if c is not None), default=total)


def _scored_label(result: dict[str, Any], metric: str) -> str:
    """`metric`'s column heading, with the tasks it is defined on where those are fewer
    than the tasks scored (its mean is over them alone)."""
    label = METRIC_LABELS.get(metric, metric)
    count, total = _num_scored(result, metric), result.get("num_tasks")
    if total is None or count is None or count >= total:
        return label
    return f"{label} ({count} of {total} tasks)"


# How `plot_forecasts` draws each forecast (history and a combination are drawn apart).
STYLES = {
    "truth": dict(color="black", lw=2.0, marker="o", ms=3, label="truth"),
    "unadapted": dict(color="tab:orange", lw=1.6, ls="--", label="meta-trained, no adaptation"),
    "adapted": dict(color="tab:blue", lw=2.0, label="meta-trained + adapted"),
}


def plot_forecasts(examples: list[dict], path: str | os.PathLike, title: str | None = None):
    """Draws up to 6 query forecasts: history, truth, unadapted and adapted forecast, and
    a forecast combination where an example has one (`combination`, `combination_label`).

    The x axis is in steps relative to the forecast origin (the first query step is 0).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    examples = examples[:6]
    num_cols = min(3, len(examples))
    num_rows = math.ceil(len(examples) / num_cols)
    width = max(4.6 * num_cols, 8.0)
    # Legend entries per row: as many as the width holds; title lines likewise.
    num_labels = 1 + len(STYLES) + any("combination" in e for e in examples)
    legend_cols = min(num_labels, max(2, int(width // 2.6)))
    legend_rows = math.ceil(num_labels / legend_cols)
    if title:
        title = "\n".join(textwrap.wrap(title, width=int(width * 11)))
    title_lines = title.count("\n") + 1 if title else 0
    bottom, top = 0.15 + 0.22 * legend_rows, 0.1 + 0.25 * title_lines
    height = 3.2 * num_rows + bottom + top
    fig, axes = plt.subplots(num_rows, num_cols, figsize=(width, height), squeeze=False)
    for ax, example in zip(axes.flat, examples, strict=False):
        history = np.asarray(example["history"], dtype=np.float64)
        horizon = len(example["truth"])
        ax.plot(np.arange(-len(history), 0), history, color="0.45", lw=1.2, label="history")
        steps = np.arange(horizon)
        for key, style in STYLES.items():
            if key in example:
                ax.plot(steps, np.asarray(example[key], dtype=np.float64), **style)
        if "combination" in example:
            ax.plot(
                steps,
                np.asarray(example["combination"], dtype=np.float64),
                color="tab:green",
                lw=1.6,
                ls="-.",
                label=example.get("combination_label", "combination"),
            )
        ax.axvline(-0.5, color="0.7", lw=0.8, ls=":")
        ax.set_title(str(example.get("title", "")), fontsize=9)
        ax.tick_params(labelsize=8)
        ax.set_xlabel("steps from forecast origin", fontsize=8)
    for ax in list(axes.flat)[len(examples) :]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=legend_cols, fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, bottom / height, 1, 1 - top / height))
    try:
        with atomic_file(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)


def _format_score(score: dict[str, Any]) -> str:
    if score.get("num_diverged"):
        return f"diverged ({score['num_diverged']}/{score['num_tasks']} tasks)"
    value = _number(score["value"])
    half = score.get("ci95")
    if half is None or not np.isfinite(half):
        return value
    if abs(half) <= 1e-9 * max(1.0, abs(float(score["value"] or 0.0))):
        half = 0.0  # rounding noise of identical scores (2.5e-17), not an interval
    return f"{value} ± {_number(half)}"


def _group_cell(score: dict[str, Any]) -> str:
    if score.get("num_diverged"):
        return f"diverged ({score['num_diverged']})"
    return _number(score["value"])


def _number(value: Any) -> str:
    if value is None:
        return "–"
    value = float(value)
    if not np.isfinite(value):
        return "n/a"
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.3e}"
    if magnitude >= 100:
        return f"{value:.1f}"
    return f"{value:.3f}" if magnitude < 10 else f"{value:.2f}"


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items())
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return " | ".join(f"({_plain(v)})" for v in value)
    if isinstance(value, list):  # e.g. a split's class names
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _atomic_write_table(path: Path, columns: dict[str, list]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_file(path) as tmp:
        pq.write_table(pa.table(columns), tmp)


def read_tasks(path: str | os.PathLike) -> dict[str, list]:
    """The columns of a `tasks.parquet` written by `write_report`."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pydict()


def _atomic_write_text(path: Path, text: str) -> None:
    atomic_write_text(path, text)
