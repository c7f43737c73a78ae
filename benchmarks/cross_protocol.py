"""The competition holdout forecast by a VALIDATION-trained run and by the TEST run.

A diagnosis, not a protocol: both runs forecast the same series' holdout from the whole
training part (`metadist.api.load_run(...).forecast`, unguarded), so they differ only in
what they were trained on (the validation run's store lacks each series' last h values)
and in their training's chance (checkpoint, early stop). If the validation-trained run
scores much better on the holdout, the test run's training, selection or forecasting
path differs; if it scores as the test run does, the model's shortfall on the holdout
is in the data. Scores: MAPE and sMAPE pooled over forecast points, and the median and
mean signed percentage error ((forecast - truth) / |truth|) of each method.

    python benchmarks/cross_protocol.py --data DATA_DIR --label yearly \\
        --validation VAL/h4/L8-smape-s1 --test TEST/h4/L8-smape-s1 [--json OUT.json]

The holdout is read for scoring only: nothing here chooses a setting.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from metadist.api import load_run
from metadist.commands.competition.spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import output_file, script_parser  # noqa: E402

METHODS = ("adapted", "unadapted", "seasonal_naive")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--data", type=Path, required=True, help="train and test parquet")
    parser.add_argument("--label", required=True, help="the label (frequency) scored")
    parser.add_argument("--validation", type=Path, required=True, help="a validation run")
    parser.add_argument("--test", type=Path, required=True, help="the test run, same group")
    parser.add_argument("--json", type=output_file, help="append the scores here (JSON lines)")
    return parser.parse_args(argv)


def scores(truth: np.ndarray, forecast: np.ndarray) -> dict[str, float]:
    """MAPE, sMAPE and the median and mean signed percentage error, in percent.

    Args:
        truth, forecast: `[N, h]` holdout values and forecasts.
    """
    error = forecast - truth
    return {
        "mape": float(np.mean(np.abs(error) / np.abs(truth)) * 100),
        "smape": float(np.mean(2 * np.abs(error) / (np.abs(truth) + np.abs(forecast))) * 100),
        "median_bias": float(np.median(error / np.abs(truth)) * 100),
        "mean_bias": float(np.mean(error / np.abs(truth)) * 100),
    }


def forecast_scores(
    run_dir: Path, history: pd.DataFrame, truth: pd.Series, spec, period: int
) -> dict[str, dict[str, float]]:
    """Each method's scores of `run_dir`'s forecasts of `truth` (`{series: [h]}`)."""
    run = load_run(run_dir)
    table = run.forecast(
        history[[spec.entity_col, spec.time_col, spec.value_col]],
        methods=list(METHODS),
        period=period,
        guard=False,
    ).to_pandas()
    out = {}
    for method in METHODS:
        rows = table[table.method == method].sort_values([spec.entity_col, "step"])
        by_series = rows.groupby(spec.entity_col)[spec.value_col].apply(np.asarray)
        y = np.stack(truth.loc[by_series.index].to_numpy())
        out[method] = scores(y, np.stack(by_series.to_numpy()))
    return out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        spec = load_spec(args.data)
        train = pd.read_parquet(args.data / spec.train)
        test = pd.read_parquet(args.data / spec.test)
    except (OSError, ValueError) as error:
        raise SystemExit(f"cross_protocol: --data {args.data}: {error}") from None
    train = train[train[spec.label_col] == args.label]
    test = test[test[spec.label_col] == args.label].sort_values([spec.entity_col, spec.time_col])
    if train.empty:
        raise SystemExit(f"--label {args.label}: no series of that {spec.label_col}")
    period = int(train[spec.period_col].iloc[0]) if spec.period_col else 1
    truth = test.groupby(spec.entity_col)[spec.value_col].apply(np.asarray)
    result = {"label": args.label, "series": int(len(truth))}
    for name, run_dir in (("validation_trained", args.validation), ("test_trained", args.test)):
        try:
            result[name] = forecast_scores(run_dir, train, truth, spec, period)
        except (OSError, ValueError) as error:
            raise SystemExit(f"cross_protocol: {run_dir}: {error}") from None
    for name in ("validation_trained", "test_trained"):
        line = ", ".join(
            f"{m} {s['mape']:.2f} / {s['smape']:.2f} ({s['median_bias']:+.1f} %, "
            f"{s['mean_bias']:+.1f} %)"
            for m, s in result[name].items()
        )
        print(f"{args.label} {name}: MAPE / sMAPE (median, mean signed error): {line}")
    if args.json:
        line = json.dumps({**result, "runs": [str(args.validation), str(args.test)]}) + "\n"
        with args.json.open("a") as handle:
            handle.write(line)  # one write: a line of its own, never half of one
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
