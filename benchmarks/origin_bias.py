"""How the last windows of a competition's training part behave, origin by origin.

For each label (frequency) of a competition data set and each forecast origin k = 1..K
(origin k: the window of h values ending (k - 1) h values before each series' training
part ends; origin 1 is the validation protocol's holdout), scores seasonal naive and
naive with drift (the last value plus the history's mean step: what carrying the growth
forward gives) on that window from the values before it: the data set's metric and the
mean signed error, mean((forecast - truth) / |truth|) over forecast points. Reads the
training file only, never the competition holdout.

Why: a validation holdout is one window. Where every origin rewards carrying the growth
forward (drift better than seasonal naive, seasonal naive's signed error negative at
each), choosing settings on more origins (rolling-origin validation) chooses the same
way, and a holdout whose growth stops is a shift no validation on this training part
can see.

    python benchmarks/origin_bias.py data/tourism --origins 3 --json benchmarks/results/origin_bias_tourism.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from metadist.commands.competition.spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, output_file, script_parser  # noqa: E402
from written import write_results  # noqa: E402


def _periodic(frame: pd.DataFrame, column: str | None, mapping: dict, label) -> int:
    if column is not None and column in frame:
        return int(frame[column].iloc[0])
    return int(mapping[str(label)])


def _scores(truth: np.ndarray, forecast: np.ndarray) -> dict[str, float]:
    ape = np.abs(forecast - truth) / np.abs(truth)
    smape = 2 * np.abs(forecast - truth) / (np.abs(truth) + np.abs(forecast))
    return {
        "mape": float(100 * ape.mean()),
        "smape": float(100 * smape.mean()),
        "signed": float(100 * ((forecast - truth) / np.abs(truth)).mean()),
    }


def origin_table(data_dir: Path, origins: int) -> list[dict]:
    """One row per label and origin: the series scored and both methods' scores."""
    spec = load_spec(data_dir)
    frame = pd.read_parquet(data_dir / spec.train)
    frame = frame.sort_values([spec.entity_col, spec.time_col])
    rows = []
    for label, part in frame.groupby(spec.label_col, sort=True):
        per_origin: dict[int, dict[str, list]] = {
            k: {"truth": [], "naive": [], "drift": []} for k in range(1, origins + 1)
        }
        series = 0
        for _, one in part.groupby(spec.entity_col, sort=False):
            values = one[spec.value_col].to_numpy(dtype=float)
            h = _periodic(one, spec.horizon_col, spec.horizons, label)
            m = _periodic(one, spec.period_col, spec.periods, label)
            series += 1
            for k in per_origin:
                end = len(values) - (k - 1) * h
                history, future = values[: end - h], values[end - h : end]
                if len(history) < max(m, 2) or len(future) < h or (future == 0).any():
                    continue
                naive = np.array([history[len(history) - m + (i % m)] for i in range(h)])
                step = (history[-1] - history[0]) / (len(history) - 1)
                drift = history[-1] + step * np.arange(1, h + 1)
                per_origin[k]["truth"].append(future)
                per_origin[k]["naive"].append(naive)
                per_origin[k]["drift"].append(drift)
        for k, parts in per_origin.items():
            if not parts["truth"]:
                continue
            truth = np.concatenate(parts["truth"])
            rows.append(
                {
                    "label": str(label),
                    "origin": k,
                    "series": len(parts["truth"]),
                    "of": series,
                    "metric": spec.metric,
                    "seasonal_naive": _scores(truth, np.concatenate(parts["naive"])),
                    "drift": _scores(truth, np.concatenate(parts["drift"])),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("data_dir", type=Path, help="a competition data directory")
    parser.add_argument("--origins", type=count, default=3, help="origins scored (default 3)")
    parser.add_argument("--json", type=output_file, help="also write the rows here")
    args = parser.parse_args(argv)
    try:
        rows = origin_table(args.data_dir, args.origins)
    except (OSError, ValueError, KeyError) as error:
        print(f"origin_bias: {error}", file=sys.stderr)
        return 1
    print("| label | origin | series | seasonal naive (signed) | drift (signed) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        metric, naive, drift = row["metric"], row["seasonal_naive"], row["drift"]
        print(
            f"| {row['label']} | {row['origin']} | {row['series']} / {row['of']} | "
            f"{naive[metric]:.2f} ({naive['signed']:+.1f} %) | "
            f"{drift[metric]:.2f} ({drift['signed']:+.1f} %) |"
        )
    if args.json:
        write_results(args.json, json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
