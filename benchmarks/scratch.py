"""The from-scratch baseline's training of a forecaster, per evaluation batch: the model's
written-out backward (`WindowForecaster.batched_vjp`) against autograd, side by side.

    python benchmarks/scratch.py --rounds 7 --threads 1 \
      --json benchmarks/results/scratch-forecaster.json

`metadist.eval.scratch.fit_from_scratch` on one evaluation batch of forecast tasks from a
synthetic series store (`metadist synth`-like panel of 400 entities), as `evaluate_run`
calls it, in one process: "written out" is this checkout's path; "autograd" is the same
call with the written-out gradients hidden (`scratch._explicit_gradients` returning
None): the `torch.autograd.grad` path every forecaster took before it had a
`batched_vjp`. Rounds are interleaved (both paths, every case, in turn), so load from
other work hits both alike; the table gives medians over rounds of the wall and CPU
(`time.process_time`) seconds per batch, and the ratios of medians. Both paths' trained
parameters are compared (largest absolute difference).

Cases (`--cases`):
- `synthetic_maml`: the forecast case of `benchmarks/eval.py` (`experiment=synthetic_maml`:
  the forecaster, hidden 64-64, no window normalisation, L=32, H=8, K=8, every column),
  128 tasks, 100 Adam steps, lr 0.01, mse (`eval.batch_size`, `scratch_steps`, `scratch_lr`);
- `competition`: the `competition_cpu` recipe's model (seasonal forecaster, hidden
  256-256-256, m=4, clamp 1, L=16, H=8, K=4, the value column), 128 tasks, 100 steps on
  sMAPE (the recipe itself sets `eval.scratch_steps=0`; `competition` keeps them).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from metadist.datasets import SYNTHETIC_INGEST_ARGS, SYNTHETIC_TARGET, write_synthetic_panel
from metadist.eval import scratch
from metadist.models import build_model
from metadist.store import SeriesStore, ingest
from metadist.tasks import build_task_sampler, derive_task_seeds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, output_file, script_parser  # noqa: E402
from written import write_results  # noqa: E402

NUM_TASKS, STEPS, LR = 128, 100, 0.01
CASES = {
    # name: (sampler options, model options, loss)
    "synthetic_maml": (
        {"lookback": 32, "horizon": 8, "num_support": 8, "num_query": 4},
        {"hidden_sizes": (64, 64)},
        "mse",
    ),
    "competition": (
        {"lookback": 16, "horizon": 8, "num_support": 4, "num_query": 1,
         "input_columns": [SYNTHETIC_TARGET], "target_columns": [SYNTHETIC_TARGET]},
        {"hidden_sizes": (256, 256, 256), "window_norm": "seasonal", "target_channels": [0],
         "seasonal_period": 4, "clamp": 1.0},
        "smape",
    ),
}  # fmt: skip
PATHS = ("written out", "autograd")


def support_sets(store: SeriesStore, sampler_options: dict, seed: int):
    sampler = build_task_sampler("forecast", store, **sampler_options)
    positions = np.arange(NUM_TASKS)
    batch = sampler.sample(positions % sampler.num_units, derive_task_seeds(seed, 0, positions))
    return batch.support.x, batch.support.y


def fit(model, x, y, loss: str, path: str) -> tuple[float, float, dict]:
    """Wall and CPU seconds of one batch's training, and its parameters."""
    explicit = scratch._explicit_gradients
    if path == "autograd":
        scratch._explicit_gradients = lambda *args: None
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        params = scratch.fit_from_scratch(model, x, y, steps=STEPS, lr=LR, loss=loss)
        return time.perf_counter() - wall, time.process_time() - cpu, params
    finally:
        scratch._explicit_gradients = explicit


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--rounds", type=count, default=7)
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--json", type=output_file, help="write every measurement here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        panel = write_synthetic_panel(Path(tmp) / "panel", num_entities=400,
                                      length_range=(200, 400), seed=args.seed, num_files=2)  # fmt: skip
        ingest(panel.out_dir, Path(tmp) / "store", **SYNTHETIC_INGEST_ARGS, progress=False)
        store = SeriesStore.open(Path(tmp) / "store")
        work = {}
        for name in args.cases:
            sampler_options, model_options, loss = CASES[name]
            x, y = support_sets(store, sampler_options, args.seed)
            torch.manual_seed(args.seed)
            model = build_model("forecaster", tuple(x.shape[2:]), tuple(y.shape[2:]),
                                **model_options)  # fmt: skip
            work[name] = (model, x, y, loss)
    load = [os.getloadavg()[0]]
    times = {f"{n}: {p}": {"wall": [], "cpu": []} for n in args.cases for p in PATHS}
    difference = {}
    for _ in range(args.rounds):
        for name, (model, x, y, loss) in work.items():
            fitted = {}
            for path in PATHS:
                wall, cpu, fitted[path] = fit(model, x, y, loss, path)
                times[f"{name}: {path}"]["wall"].append(wall)
                times[f"{name}: {path}"]["cpu"].append(cpu)
            difference[name] = max(
                float((v - fitted["autograd"][k]).abs().max()) for k, v in fitted[PATHS[0]].items()
            )
    load.append(os.getloadavg()[0])
    report(args, times, difference, load)


def report(args, times: dict, difference: dict, load: list[float]) -> None:
    median = {k: {c: statistics.median(v[c]) for c in v} for k, v in times.items()}
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds, "
          f"{NUM_TASKS} tasks x {STEPS} steps per batch; load {load[0]:.1f} -> {load[1]:.1f}")  # fmt: skip
    print("| case | path | s per batch, wall (median) | CPU s (median) | CPU range |")
    print("| --- | --- | --- | --- | --- |")
    for key, value in times.items():
        cpu = value["cpu"]
        print(f"| {key.split(': ')[0]} | {key.split(': ')[1]} | {median[key]['wall']:.3f} "
              f"| {median[key]['cpu']:.3f} | {min(cpu):.3f}-{max(cpu):.3f} |")  # fmt: skip
    ratios = {}
    for name in args.cases:
        before, after = median[f"{name}: autograd"], median[f"{name}: written out"]
        ratios[name] = {c: before[c] / after[c] for c in ("wall", "cpu")}
        print(f"{name}: autograd / written out: wall {ratios[name]['wall']:.2f}x, "
              f"CPU {ratios[name]['cpu']:.2f}x; trained parameters differ by at most "
              f"{difference[name]:.1e}")  # fmt: skip
    if args.json is not None:
        record = {"threads": args.threads, "rounds": args.rounds, "tasks": NUM_TASKS,
                  "steps": STEPS, "torch": torch.__version__, "load_1min": load,
                  "seconds_per_batch": times, "median": median, "ratios": ratios,
                  "max_abs_param_difference": difference}  # fmt: skip
        write_results(args.json, json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
