"""Re-scores evaluated competition runs with the plausibility guard, no retraining.

Each group (horizon) gets its choice made on VALIDATION runs by the same code as
`metadist competition --validation` (`choice.choose_group`: the loss, adapted or not,
the band width of `metadist.eval.plausibility`, the weight against seasonal naive), and
that choice is then applied once to the group's TEST run (the competition holdout):
the model unguarded, the model within its band (as chosen), AutoETS, Theta and seasonal
naive, pooled by label and over every group as the evaluation's tables pool.
Nothing is written into the runs.

    python benchmarks/guard_rescore.py --metric mape \\
        --validation 4=mape:VAL/h4/L8-mape-s1,smape:VALS/h4/L8-smape-s1 ... \\
        --test 4=TEST/h4/L8-smape-s1 ... [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from metadist.commands.competition.choice import choose_group
from metadist.commands.competition.guard import guarded_model, read_forecasts, read_points
from metadist.eval.fallback_combination import pooled_score
from metadist.eval.metrics import point_terms
from metadist.eval.plausibility import parse_width
from metadist.eval.report import EVAL_DIR, FORECASTS_NAME

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import output_file, script_parser  # noqa: E402
from written import write_results  # noqa: E402

BASELINES = {"ets": "AutoETS", "theta": "Theta", "seasonal_naive": "seasonal naive"}


def _validation_group(text: str) -> str:
    """`--validation H=loss:RUN,loss:RUN`."""
    key, _, runs = text.partition("=")
    if not key or not all(
        loss and path for loss, _, path in (r.rpartition(":") for r in runs.split(","))
    ):
        raise argparse.ArgumentTypeError(f"{text!r} is not H=loss:RUN,loss:RUN")
    return text


def _test_group(text: str) -> str:
    """`--test H=RUN`."""
    key, _, run = text.partition("=")
    if not key or not run:
        raise argparse.ArgumentTypeError(f"{text!r} is not H=RUN")
    return text


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--metric", required=True, help="the data set's metric")
    parser.add_argument(
        "--validation", nargs="+", type=_validation_group, required=True, help="H=loss:RUN,loss:RUN"
    )
    parser.add_argument(
        "--test", nargs="+", type=_test_group, required=True, help="H=RUN (the chosen loss)"
    )
    parser.add_argument("--json", type=output_file, help="write the choices and scores here")
    return parser.parse_args(argv)


def group_runs(specs: list[str], with_loss: bool) -> dict[str, dict[str, Path]]:
    out: dict[str, dict[str, Path]] = {}
    for spec in specs:
        key, _, runs = spec.partition("=")
        entries = {}
        for item in runs.split(","):
            loss, _, path = item.rpartition(":") if with_loss else ("", "", item)
            if not (Path(path) / EVAL_DIR / FORECASTS_NAME).is_file():
                raise SystemExit(f"{path}: no evaluated forecasts ({EVAL_DIR}/{FORECASTS_NAME})")
            entries[loss] = Path(path)
        out[key] = entries
    return out


def scored_rows(run: Path, entry: dict, metric: str) -> dict[str, np.ndarray]:
    """The points of a run as the choice applies it: truth, unguarded, guarded, the
    baselines, the series and the label."""
    points = read_points(run, entry["method"])
    frame = read_forecasts(run)  # the same order as `points`
    rows = {
        "truth": points["truth"],
        "task": points["task"],
        "label": points["label"],
        "scale": points["scale"],
        "unguarded": points["model"],
        "guarded": guarded_model(points, run, parse_width(entry["guard"])),
    }
    for column in BASELINES:  # a run without AutoETS (`--ets no`) has no `ets` column
        present = column in frame.columns
        rows[column] = (
            frame[column].to_numpy(np.float64) if present else np.full(len(frame), np.nan)
        )
    return rows


def table(parts: list[dict[str, np.ndarray]], metric: str) -> dict[str, dict[str, float]]:
    joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    out = {}
    for label in [*dict.fromkeys(joined["label"].tolist()), "all"]:
        rows = np.ones(len(joined["truth"]), bool) if label == "all" else joined["label"] == label
        out[label] = {
            # a baseline the runs have no forecasts of (AutoETS under `--ets no`) has no
            # score: sMAPE's terms of a NaN forecast are 0, which would read as perfect
            name: pooled_score(
                point_terms(
                    metric, joined["truth"][rows], joined[name][rows], joined["scale"][rows]
                ),
                joined["task"][rows],
            )
            if np.isfinite(joined[name][rows]).any()
            else float("nan")
            for name in ("unguarded", "guarded", *BASELINES)
        }
        out[label]["series"] = float(len(set(joined["task"][rows].tolist())))
    return out


def markdown(scores: dict[str, dict[str, float]], metric: str) -> str:
    names = ["model alone, unguarded", "model, guarded as chosen", *BASELINES.values()]
    lines = [
        f"| {metric} | series | " + " | ".join(names) + " |",
        "| --- | ---: |" + " ---: |" * len(names),
    ]
    for label, row in scores.items():
        cells = [
            f"{row[k]:.2f}" if np.isfinite(row[k]) else "n/a"
            for k in ("unguarded", "guarded", *BASELINES)
        ]
        lines.append(f"| {label} | {int(row['series'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    validation = group_runs(args.validation, with_loss=True)
    test = group_runs(args.test, with_loss=False)
    if set(validation) != set(test):
        raise SystemExit("--validation and --test must name the same groups")
    choices, val_parts, test_parts = {}, [], []
    for key, runs in validation.items():
        entry = choose_group(runs)
        if entry["metric"] != args.metric:
            raise SystemExit(f"H={key}: the runs were scored by {entry['metric']}")
        choices[key] = entry
        guards = ", ".join(f"{k} {v:.3f}" for k, v in entry["guards"].items())
        print(
            f"H={key}: loss {entry['loss']} ({entry['method']}), band width {entry['guard']} "
            f"(validation {args.metric} by width: {guards}); weight {entry['weight']:.1f}"
        )
        val_parts.append(scored_rows(runs[entry["loss"]], entry, args.metric))
        test_parts.append(scored_rows(test[key][""], entry, args.metric))
    scores = {"validation": table(val_parts, args.metric), "test": table(test_parts, args.metric)}
    for name, rows in scores.items():
        print(f"\n{name}\n{markdown(rows, args.metric)}")
    if args.json:
        write_results(
            args.json, json.dumps({"choices": choices, "scores": scores}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
