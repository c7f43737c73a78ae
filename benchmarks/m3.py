"""M3 benchmark: meta-train `m3_maml` and score all 3003 series on their competition holdout.

    python benchmarks/m3.py [--run-dir runs/m3_maml] [TRAINING OVERRIDES ...]

Steps (each skipped when its output is already there):

1. `metadist datasets m3 data/m3` — train.parquet and, apart, the holdout test.parquet;
2. `metadist ingest data/m3/train.parquet data/m3/store ... --scaling per-entity` — only
   the training parts enter the store (the window-normalised model cancels the per-entity
   affine scaling; it only weights each series in the MSE meta-loss by 1/std², where raw
   values would weight it by its squared magnitude);
3. `python -m metadist.train experiment=m3_maml run_dir=RUN_DIR`, which ends with the
   evaluation (`python -m metadist.eval`) writing `RUN_DIR/eval/metrics.md`.

Prints the wall time of each step and the evaluation tables (sMAPE overall, per frequency
and per category, next to naive, seasonal naive and the published Theta and ForecastPro
figures). The training process runs single-threaded (`OMP_NUM_THREADS=1`): on a small
shared CPU, torch's intra-op threads otherwise spin against each other.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

DATA = Path("data/m3")
STORE = DATA / "store"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="runs/m3_maml")
    parser.add_argument("overrides", nargs="*", help="training overrides (key=value)")
    args = parser.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.setdefault("WANDB_MODE", "disabled")
    metadist = [sys.executable, "-m", "metadist.cli"]
    steps = []
    if not (DATA / "train.parquet").is_file():
        steps.append(("M3 as Parquet", [*metadist, "datasets", "m3", str(DATA)]))
    if not STORE.is_dir():
        ingest = [
            *metadist,
            "ingest",
            str(DATA / "train.parquet"),
            str(STORE),
            "--entity-col=series_id",
            "--time-col=t",
            "--features=value",
            "--targets=value",
            "--stratum-col=category",
            "--label-col=frequency",
            "--scaling=per-entity",
            "--no-progress",
        ]
        steps.append(("ingest the training parts", ingest))
    train = [
        sys.executable,
        "-m",
        "metadist.train",
        "experiment=m3_maml",
        f"run_dir={args.run_dir}",
        "logging.progress=false",
        *args.overrides,
    ]
    steps.append(("meta-train m3_maml, then evaluate", train))
    for title, command in steps:
        print(f"== {title}: {' '.join(command[1:])}", flush=True)
        started = time.perf_counter()
        code = subprocess.call(command, env=env)
        print(f"== {title}: {time.perf_counter() - started:.1f} s (exit status {code})")
        if code != 0:
            return code
    table = Path(args.run_dir) / "eval" / "metrics.md"
    if not table.is_file():
        print(f"no evaluation table at {table}", file=sys.stderr)
        return 1
    print(table.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
