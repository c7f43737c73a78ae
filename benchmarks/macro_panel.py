"""A panel not named in the forecasting issues: statsmodels' US macroeconomic data.

Writes the twelve quarterly series of `statsmodels.datasets.macrodata` (1959Q1-2009Q3,
203 quarters: real GDP, consumption, investment, government spending, disposable income,
CPI, M1, the T-bill rate, unemployment, population, inflation, the real interest rate) as
a `metadist competition` data directory: the last `--horizon` quarters of each series are
the holdout, sMAPE is the metric, period 4. Then:

    metadist competition OUT --validation --recipe cpu --out runs/macro_val
    metadist competition OUT --recipe cpu --out runs/macro --adaptation-from runs/macro_val

statsmodels ships the data in its wheel (nothing is downloaded); it comes with
`metadist[ets]` (statsforecast needs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from metadist.durable import atomic_directory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, script_parser  # noqa: E402

_YAML = """# statsmodels' macrodata (US, quarterly, 1959Q1-2009Q3) in metadist's long format,
# written by benchmarks/macro_panel.py: the last {horizon} quarters of each series are the
# holdout.
name: macro
metric: smape
"""


def macro_panel(horizon: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training part, holdout) of the twelve series in metadist's long format."""
    from statsmodels.datasets import macrodata

    wide = macrodata.load_pandas().data.drop(columns=["year", "quarter"])
    frames = []
    for name in wide.columns:
        values = wide[name].to_numpy(dtype=float)
        frames.append(
            pd.DataFrame({"series_id": name, "t": range(len(values)), "value": values}).assign(
                category="macro", frequency="quarterly", horizon=horizon, period=4
            )
        )
    panel = pd.concat(frames, ignore_index=True)
    cut = panel.groupby("series_id")["t"].transform("max") - horizon
    return panel[panel.t <= cut].reset_index(drop=True), panel[panel.t > cut].reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("out", type=directory, help="a new or empty directory")
    parser.add_argument("--horizon", type=count, default=8, help="holdout quarters (default 8)")
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out} is not empty")
    try:
        train, test = macro_panel(args.horizon)
    except ImportError:
        print(
            "macro_panel: statsmodels is not installed (pip install statsmodels)", file=sys.stderr
        )
        return 1
    with atomic_directory(args.out, replace=True) as partial:  # empty or not there yet
        train.to_parquet(partial / "train.parquet", index=False)
        test.to_parquet(partial / "test.parquet", index=False)
        (partial / "competition.yaml").write_text(_YAML.format(horizon=args.horizon))
    print(f"{args.out}: {train.series_id.nunique()} series, {len(train)} training values, "
          f"{len(test)} holdout values")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
