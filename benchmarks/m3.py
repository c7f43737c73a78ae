"""M3 benchmark: meta-train `m3_maml` and score all 3003 series on their competition holdout.

    python benchmarks/m3.py [--out runs/m3] [--seeds 3] [--jobs 2] [--validation]
                            [TRAINING OVERRIDES ...]

The M3 horizons differ by frequency (6 yearly, 8 quarterly and other, 18 monthly), so
`m3_maml` is meta-trained once per horizon, each time on the training parts of all 3003
series (every series long enough gives tasks; yearly and quarterly data are too few to
learn from alone), and each model forecasts the frequencies of its horizon directly:

| model | sampler | evaluated on |
| --- | --- | --- |
| h6 | `sampler=m3_h6` | yearly |
| h8 | `sampler=m3_h8` | quarterly, other |
| h18 | `sampler=m3_h18` | monthly |

Steps (each skipped when its output is already there):

1. `metadist datasets m3 data/m3` — train.parquet and, apart, the holdout test.parquet;
2. `metadist ingest data/m3/train.parquet data/m3/store ... --scaling none` — only the
   training parts enter the store, unscaled (the model normalises each window itself;
   the sMAPE loss is scale-free);
3. `metadist train experiment=m3_maml sampler=m3_hN trainer.seed=S --no-eval`
   for every horizon and seed (`--jobs` at a time, one thread each);
4. `metadist eval run_dir=... eval.labels=[...] eval.ensemble=[other seeds]`
   per horizon: the seeds' models forecast as one (mean), on their frequencies;
5. `python -m metadist.eval.combine OUT ...`: one table of the 3003 series, sMAPE overall,
   per frequency and per category, next to naive, seasonal naive, the Theta method
   computed here and the published Theta and ForecastPro figures (OUT/metrics.md).

`--validation` runs the same protocol one horizon earlier (`metadist datasets m3
--validation`: each training part without its last h values is the training data, those
h values the holdout; the competition holdout is not read): settings are chosen there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODELS = {  # name: (sampler config, frequencies it forecasts)
    "h6": ("m3_h6", ["yearly"]),
    "h8": ("m3_h8", ["quarterly", "other"]),
    "h18": ("m3_h18", ["monthly"]),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="default: runs/m3 (runs/m3_val)")
    parser.add_argument("--seeds", type=int, default=3, help="models per horizon (ensemble)")
    parser.add_argument("--jobs", type=int, default=2, help="training processes at a time")
    parser.add_argument("--validation", action="store_true", help="the validation protocol")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("overrides", nargs="*", help="training overrides (key=value)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
    data = Path("data/m3val" if args.validation else "data/m3")
    store = data / "store"
    out = Path(args.out or ("runs/m3_val" if args.validation else "runs/m3"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("WANDB_MODE", "disabled")
    metadist = [sys.executable, "-m", "metadist.cli"]
    started = time.perf_counter()

    prepare = []
    if not (data / "train.parquet").is_file():
        extra = ["--validation"] if args.validation else []
        prepare.append(("M3 as Parquet", [*metadist, "datasets", "m3", str(data), *extra]))
    if _store_scaling(store) != "none":  # missing, or an older store scaled per entity
        ingest = [
            *metadist,
            "ingest",
            str(data / "train.parquet"),
            str(store),
            "--entity-col=series_id",
            "--time-col=t",
            "--features=value",
            "--targets=value",
            "--stratum-col=category",
            "--label-col=frequency",
            "--scaling=none",
            "--no-progress",
        ]
        prepare.append(("ingest the training parts", ingest))
    for title, command in prepare:
        if _run(title, command, env) != 0:
            return 1

    data_overrides = [f"data.store={store}"]
    eval_overrides = [f"eval.holdout.path={data / 'test.parquet'}"]
    runs: dict[str, list[Path]] = {}
    jobs = []
    for name in args.models:
        sampler, _ = MODELS[name]
        runs[name] = [out / name / f"seed{seed}" for seed in range(1, args.seeds + 1)]
        for seed, run_dir in enumerate(runs[name], start=1):
            command = [
                sys.executable,
                "-m",
                "metadist.train",
                "experiment=m3_maml",
                f"sampler={sampler}",
                f"trainer.seed={seed}",
                f"run_dir={run_dir}",
                "logging.progress=false",
                "--no-eval",
                *data_overrides,
                *args.overrides,
            ]
            jobs.append((f"meta-train {name} seed {seed}", command, run_dir))
    if _run_parallel(jobs, env, args.jobs) != 0:
        return 1
    for name, run_dirs in runs.items():
        _, labels = MODELS[name]
        command = [
            sys.executable,
            "-m",
            "metadist.eval",
            f"run_dir={run_dirs[0]}",
            f"eval.labels=[{','.join(labels)}]",
            *eval_overrides,
        ]
        if len(run_dirs) > 1:
            command.append(f"eval.ensemble=[{','.join(str(d) for d in run_dirs[1:])}]")
        if _run(f"evaluate {name} on {', '.join(labels)}", command, env, quiet=True) != 0:
            return 1
    firsts = [str(run_dirs[0]) for run_dirs in runs.values()]
    if len(firsts) > 1:
        title = "m3_maml" + (" (validation protocol)" if args.validation else "")
        title += f": {args.seeds} seed(s) per horizon, one model per horizon"
        command = [
            sys.executable,
            "-m",
            "metadist.eval.combine",
            str(out),
            *firsts,
            "--title",
            title,
        ]
        if _run("combine the horizons", command, env, quiet=True) != 0:
            return 1
        table = out / "metrics.md"
    else:
        table = Path(firsts[0]) / "eval" / "metrics.md"
    print(table.read_text())
    print(f"== all steps: {time.perf_counter() - started:.1f} s; table: {table}")
    return 0


def _store_scaling(store: Path) -> str | None:
    try:
        return json.loads((store / "metadata.json").read_text())["scaling"]["kind"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _run(title: str, command: list[str], env: dict, quiet: bool = False) -> int:
    print(f"== {title}: {' '.join(command[1:])}", flush=True)
    began = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=quiet, text=True, check=False)
    print(f"== {title}: {time.perf_counter() - began:.1f} s (exit status {done.returncode})")
    if done.returncode != 0 and quiet:
        print(done.stdout[-4000:] + done.stderr[-4000:], file=sys.stderr)
    return done.returncode


def _run_parallel(jobs: list[tuple[str, list[str], Path]], env: dict, width: int) -> int:
    """Runs the training jobs `width` at a time, each logging to `<run_dir>.log`."""
    pending, running, failed = list(jobs), [], []
    while pending or running:
        while pending and len(running) < width:
            title, command, run_dir = pending.pop(0)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log = open(run_dir.with_suffix(".log"), "w")  # noqa: SIM115 (closed below)
            print(f"== {title}: {' '.join(command[1:])} (log: {log.name})", flush=True)
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((title, process, log, time.perf_counter()))
        time.sleep(1.0)
        for entry in list(running):
            title, process, log, began = entry
            if process.poll() is None:
                continue
            running.remove(entry)
            log.close()
            print(
                f"== {title}: {time.perf_counter() - began:.1f} s (exit status "
                f"{process.returncode})",
                flush=True,
            )
            if process.returncode != 0:
                failed.append(f"{title} (see {log.name})")
    if failed:
        print("failed: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
