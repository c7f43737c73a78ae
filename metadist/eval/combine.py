"""One table from the evaluations of several runs: `python -m metadist.eval.combine`.

    python -m metadist.eval.combine OUT_DIR RUN_DIR [RUN_DIR ...] [--title TITLE]

A panel is often meta-trained as several runs, each on its own part of the series (a
model per frequency of a forecasting competition: `sampler.options.labels`). Each run's
evaluation writes one row per task to `<run_dir>/eval/tasks.parquet` (points scored and
every method's sum of every metric over them); combining concatenates those rows (and
the runs' `forecasts.parquet`, every forecast point) and
pools them exactly as one evaluation of all the tasks would: the scores are means over
all forecast points, the ± is the 95% CI of the per-task mean, groups (frequency,
category) are recomputed across runs. `OUT_DIR` gets `metrics.json`, `metrics.md`,
`tasks.parquet` and (when every run kept its points) `forecasts.parquet`; each run keeps
its own figure. The command line is `metadist.commands.combine` (on the top floor).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from metadist.eval.report import EVAL_DIR, FORECASTS_NAME, JSON_NAME, TASKS_NAME, read_tasks
from metadist.eval.scoring import TaskScores, group_summaries, overall_summary

# The method a combine adds when each run names one of its own methods (`chosen`): the
# meta-trained model's forecast, adapted or not as a validation run decided per run.
CHOSEN = "chosen"
# unguarded: a competition's test run reports the model within its plausibility band, as
# validation chose it, apart (`OUT/guarded.md`)
CHOSEN_LABEL = "meta-trained model, unguarded (adaptation as chosen on validation)"
# Settings of each run shown in the combined table's settings line.
_RUN_SETTINGS = ("experiment", "checkpoint", "learner", "model", "inner_steps", "tasks")


def combine_runs(
    run_dirs: list[str | os.PathLike],
    title: str | None = None,
    chosen: list[str] | None = None,
) -> dict[str, Any]:
    """The pooled evaluation of `run_dirs` (each evaluated with `metadist eval`,
    or itself the output directory of a combine).

    Args:
        chosen: one method of each run (`adapted` or `unadapted`, say): the pooled
            result gains the method `chosen`, whose tasks and forecast points are those
            of each run's chosen method (a competition's model alone, adapted on the
            horizons where adaptation won on validation). With it, one run is enough.

    Returns:
        A result dict like `evaluate_run`'s (`overall`, `groups`, `per_task`, ...), whose
        `settings.runs` lists each run's own settings.

    Raises:
        ValueError: fewer than two runs (without `chosen`), a run twice, runs with
            different methods, metrics or groupings, runs evaluated on different splits
            (`eval.split`), a task (entity) evaluated by two runs, or a `chosen` that
            does not name one scored method per run.
        FileNotFoundError: a run without `eval/metrics.json` and `eval/tasks.parquet`.
    """
    paths = [Path(p) for p in run_dirs]
    if not paths:
        raise ValueError("combine needs at least one run directory")
    if chosen is not None and len(chosen) != len(paths):
        raise ValueError(f"combine: {len(chosen)} chosen method(s) for {len(paths)} run(s)")
    if len({p.resolve() for p in paths}) != len(paths):
        raise ValueError("combine: a run directory is given twice")
    results, tables = _read_runs(paths)
    _check_alike(paths, results, tables)
    columns = {key: [v for table in tables for v in table[key]] for key in tables[0]}
    if "group:entity" in columns:
        _check_one_run_per_entity(paths, tables)
    forecasts, point_rows = _read_forecasts(paths)
    methods = dict(results[0]["methods"])
    if chosen is not None:
        for path, method in zip(paths, chosen, strict=True):
            if method not in methods or method == CHOSEN:
                raise ValueError(
                    f"combine: {path} scored no method {method!r}; it scored "
                    f"{', '.join(m for m in methods if m != CHOSEN)}"
                )
        _add_chosen(columns, [len(t["num_points"]) for t in tables], chosen)
        if forecasts is not None:
            _add_chosen(forecasts, point_rows, chosen)
        methods = {CHOSEN: CHOSEN_LABEL, **{k: v for k, v in methods.items() if k != CHOSEN}}
    return _pooled(paths, results, columns, forecasts, methods, title, chosen)


def check_out_dir(out_dir: str | os.PathLike, run_dirs: list[str | os.PathLike]) -> None:
    """Refuses an output directory that would replace what is pooled: a run's own
    evaluation (`RUN/eval`), the run directory itself (its files would then be read as
    its evaluation) or an earlier combine given as a run; or a file.

    Raises:
        ValueError: naming the output and the run it would overwrite.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"combine: OUT_DIR {out} is a file, not a directory")
    for run in map(Path, run_dirs):
        if out.resolve() in (run.resolve(), _evaluation_dir(run).resolve()):
            raise ValueError(
                f"combine: OUT_DIR {out} would overwrite the evaluation of {run} it pools; "
                "write the combined table to a directory of its own"
            )


def _evaluation_dir(path: Path) -> Path:
    """Where a run's evaluation files are: `<run_dir>/eval`, or the directory itself for
    the output of an earlier combine (files directly inside)."""
    return path if (path / JSON_NAME).is_file() else path / EVAL_DIR


def _read_runs(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, list]]]:
    """Each run's summary (`metrics.json`) and per-task table (`tasks.parquet`).

    Raises:
        FileNotFoundError: a run without either, saying how to evaluate it.
        ValueError: either cannot be read, or the summary is not an evaluation's.
    """
    results, tables = [], []
    for path in paths:
        where = _evaluation_dir(path)
        summary, tasks = where / JSON_NAME, where / TASKS_NAME
        if not summary.is_file() or not tasks.is_file():
            missing = summary if not summary.is_file() else tasks
            raise FileNotFoundError(
                f"{path} has no evaluation to combine ({missing} is missing); evaluate it "
                f"first: metadist eval run_dir={path}"
            )
        result = _read(summary, lambda path: json.loads(path.read_text()))
        if not isinstance(result, dict) or not isinstance(result.get("methods"), dict):
            raise ValueError(f"combine: {summary} is not the metrics.json of an evaluation")
        table = _read(tasks, read_tasks)
        results.append(result)
        tables.append(table)
    return results, tables


def _read(path: Path, read: Callable[[Path], Any]) -> Any:
    """`read(path)`; its errors (JSON's, Arrow's) as one naming the file."""
    try:
        return read(path)
    except (ValueError, OSError) as error:
        raise ValueError(f"combine: {path} cannot be read ({error})") from None


def _check_alike(
    paths: list[Path], results: list[dict[str, Any]], tables: list[dict[str, list]]
) -> None:
    """Refuses runs that were not evaluated alike (kind, methods, metrics, task columns,
    the split evaluated where both record it).

    Raises:
        ValueError: naming the first run that differs from the first and how.
    """
    first = results[0]
    for path, result, table in zip(paths[1:], results[1:], tables[1:], strict=True):
        for key in ("kind", "methods", "metrics", "primary_metric"):
            if result.get(key) != first.get(key):
                raise ValueError(
                    f"combine: {path} has {key} {result.get(key)!r}, {paths[0]} has "
                    f"{first.get(key)!r}; only evaluations of the same kind can be pooled"
                )
        split, first_split = _split(result), _split(first)
        if split is not None and first_split is not None and split != first_split:
            raise ValueError(
                f"combine: {path} was evaluated on eval.split={split!r}, {paths[0]} on "
                f"eval.split={first_split!r}; only evaluations of the same split can be pooled"
            )
        if sorted(table) != sorted(tables[0]):
            raise ValueError(
                f"combine: the tasks of {path} have columns {sorted(table)}, "
                f"{paths[0]}'s has {sorted(tables[0])}"
            )


def _split(result: dict[str, Any]) -> str | None:
    """The split a run's evaluation (or a combine of runs of one split) scored, where it
    records one."""
    split = result.get("settings", {}).get("split")
    return None if split is None else str(split)


def _check_one_run_per_entity(paths: list[Path], tables: list[dict[str, list]]) -> None:
    """Refuses a task (entity) scored by two runs.

    Raises:
        ValueError: naming the entity and both runs.
    """
    owner: dict[str, Path] = {}
    for path, table in zip(paths, tables, strict=True):
        for entity in table["group:entity"]:
            if entity in owner:
                raise ValueError(
                    f"combine: entity {entity!r} is evaluated by both {owner[entity]} and "
                    f"{path}; each task may be scored by one run only"
                )
            owner[entity] = path


def _read_forecasts(paths: list[Path]) -> tuple[dict[str, list] | None, list[int]]:
    """Every run's forecast points concatenated, when every run kept them with the same
    columns (else None), and each run's number of points."""
    point_files = [_evaluation_dir(p) / FORECASTS_NAME for p in paths]
    if not all(f.is_file() for f in point_files):
        return None, []
    point_tables = [read_tasks(f) for f in point_files]
    rows = [len(next(iter(t.values()))) for t in point_tables]
    if not all(sorted(t) == sorted(point_tables[0]) for t in point_tables):
        return None, rows
    return {k: [v for t in point_tables for v in t[k]] for k in point_tables[0]}, rows


def _pooled(
    paths: list[Path],
    results: list[dict[str, Any]],
    columns: dict[str, list],
    forecasts: dict[str, list] | None,
    methods: dict[str, str],
    title: str | None,
    chosen: list[str] | None,
) -> dict[str, Any]:
    """The pooled result of the runs' concatenated task `columns` and `forecasts`."""
    first = results[0]
    scores = TaskScores.from_table(columns)
    groupings = {g[len("group:") :]: g[len("group:") :] for g in columns if g.startswith("group:")}
    groupings.pop("entity", None)
    references: dict[str, Any] = {}
    for result in results:
        _merge_into(references, result.get("references", {}))
    return {
        "title": title or "Combined evaluation of " + ", ".join(str(p) for p in paths),
        "kind": first.get("kind"),
        "num_tasks": scores.num_tasks,
        "methods": methods,
        "metrics": first["metrics"],
        "primary_metric": first["primary_metric"],
        "primary_metric_label": first.get("primary_metric_label", first["primary_metric"]),
        "overall": overall_summary(scores, first.get("kind") == "classification"),
        "groups": group_summaries(scores, groupings),
        "references": references,
        "settings": _settings(paths, results, chosen),
        "per_task": columns,
        **({"forecasts": forecasts} if forecasts else {}),
    }


def _settings(
    paths: list[Path], results: list[dict[str, Any]], chosen: list[str] | None
) -> dict[str, Any]:
    """The pooled result's settings: the split (`_check_alike`: the same where recorded),
    each run's own, the chosen methods, the seconds."""
    splits = {_split(result) for result in results} - {None}
    return {
        **({"split": splits.pop()} if len(splits) == 1 else {}),
        "runs": [
            {
                "run_dir": str(path),
                "num_tasks": result.get("num_tasks"),
                **{
                    k: result.get("settings", {}).get(k)
                    for k in _RUN_SETTINGS
                    if k in result.get("settings", {})
                },
            }
            for path, result in zip(paths, results, strict=True)
        ],
        **({"chosen": dict(zip(map(str, paths), chosen, strict=True))} if chosen else {}),
        "aggregation": results[0].get("settings", {}).get("aggregation"),
        "seconds": round(sum(float(r.get("settings", {}).get("seconds") or 0) for r in results), 2),
    }


def _add_chosen(columns: dict[str, list], rows: list[int], chosen: list[str]) -> None:
    """Adds (or replaces) the `chosen` method's columns of concatenated tables: each
    table's `rows` rows taken from its own chosen method's columns (`<method>:<metric>`
    in per-task tables, `<method>` in forecast points)."""
    bounds = np.cumsum([0, *rows])
    sources = [key for key in columns if key == chosen[0] or key.startswith(f"{chosen[0]}:")]
    for key in sources:
        suffix = key[len(chosen[0]) :]
        values: list = []
        for method, start, stop in zip(chosen, bounds[:-1], bounds[1:], strict=True):
            values += columns[method + suffix][start:stop]
        columns[CHOSEN + suffix] = values


def _merge_into(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Adds `other`'s entries to `into`, nested maps key by key (each run's references
    name the groups it scored); where both hold a figure, the first run's stays."""
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_into(into[key], value)
        elif key not in into:
            into[key] = json.loads(json.dumps(value)) if isinstance(value, dict) else value


if __name__ == "__main__":
    # `python -m metadist.eval.combine`: the command line lives on the top floor. It is
    # looked up by name only when this file runs as a script: importing this module
    # never loads the layer above it.
    sys.exit(importlib.import_module("metadist.commands.combine").main())
