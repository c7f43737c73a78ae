"""What a store's first evaluation cannot go below on this machine: the from-scratch
baseline's training alone, for `benchmarks/eval.py`'s two cases, against issue 35's targets.

    python benchmarks/eval_floor.py --baseline-seconds 17.6 13.5 --rounds 3 \
      --json benchmarks/results/eval-floor.json

A store's first evaluation must train the from-scratch baseline on every task's support
set: 100 full-batch Adam steps of a fresh network per task (`eval.scratch_steps`,
`eval.scratch_lr`), nothing of which can be reused before it has been computed once. This
times `metadist.eval.scratch.fit_from_scratch` itself, as `evaluate_run` calls it, on
tensors of the cases' shapes, for the cases' whole task counts, in one process on
`--threads` threads:

- `fewshot`: 1,000 5-way 5-shot episodes (8 batches of 128; the last of 104) of
  `synthetic_protonet`'s MLP with the 5-way head it gets from scratch: `[32, 6]` windows,
  hidden 64, cross-entropy;
- `forecast`: 500 tasks (4 batches) of `synthetic_maml`'s forecaster: `[32, 6]` windows,
  hidden 64-64, `[8, 1]` forecasts, 8 support windows, mse.

It also times the batched product of the few-shot network's first layer alone (128
matrices of 25 x 192 times 192 x 64, the shape that costs most) and one product of the
same FLOPs, to show the throughput the small products reach. `--baseline-seconds`
(few-shot, forecast) is the other checkout's first evaluation (`benchmarks/eval.py`'s
"baseline" median); the targets are a tenth and a fifth of it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from metadist.eval.scratch import fit_from_scratch
from metadist.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, output_file, positive, script_parser  # noqa: E402
from written import write_results  # noqa: E402

STEPS, LR = 100, 0.01
# name: (model name, input shape, output shape, model options, support examples, loss,
#        tasks per batch of each evaluation batch, target divisor)
CASES = {
    "fewshot": ("mlp", (32, 6), (5,), {"hidden_sizes": (64,)}, 25, "cross_entropy",
                [128] * 7 + [104], 10),
    "forecast": ("forecaster", (32, 6), (8, 1), {"hidden_sizes": (64, 64)}, 8, "mse",
                 [128] * 3 + [116], 5),
}  # fmt: skip


def case_seconds(name: str, seed: int) -> tuple[float, float]:
    """Wall and CPU seconds of the from-scratch training of every task of case `name`."""
    model_name, in_shape, out_shape, options, support, loss, batches, _ = CASES[name]
    torch.manual_seed(seed)
    model = build_model(model_name, in_shape, out_shape, **options)
    data = []
    for tasks in batches:
        x = torch.randn(tasks, support, *in_shape)
        if loss == "cross_entropy":
            y = torch.arange(support).remainder(out_shape[0]).expand(tasks, support).clone()
        else:
            y = torch.randn(tasks, support, *out_shape)
        data.append((x, y))
    wall, cpu = time.perf_counter(), time.process_time()
    for x, y in data:
        fit_from_scratch(model, x, y, steps=STEPS, lr=LR, loss=loss)
    return time.perf_counter() - wall, time.process_time() - cpu


def product_gflops(rounds: int) -> dict[str, float]:
    """Median GFLOP/s of the few-shot first layer's batched product and of one product
    of the same FLOPs."""
    x, w = torch.randn(128, 25, 192), torch.randn(128, 192, 64)
    flat, single = x.reshape(3200, 192), torch.randn(192, 64)
    flops = 2 * 128 * 25 * 192 * 64
    out = {}
    for label, product in (("batched 128 x (25x192 @ 192x64)", lambda: torch.bmm(x, w)),
                           ("one 3200x192 @ 192x64", lambda: flat @ single)):  # fmt: skip
        product()
        times = []
        for _ in range(20 * rounds):
            started = time.perf_counter()
            product()
            times.append(time.perf_counter() - started)
        out[label] = flops / statistics.median(times) / 1e9
    return out


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--baseline-seconds", type=positive, nargs=2, metavar=("FEWSHOT", "FORECAST"),
                        required=True, help="the other checkout's first evaluation, s")  # fmt: skip
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=output_file, help="write every measurement here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = [os.getloadavg()[0]]
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in CASES}
    for _ in range(args.rounds):
        for name in CASES:
            wall, cpu = case_seconds(name, args.seed)
            times[name]["wall"].append(wall)
            times[name]["cpu"].append(cpu)
    gflops = product_gflops(args.rounds)
    load.append(os.getloadavg()[0])
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds, "
          f"load {load[0]:.1f} -> {load[1]:.1f}")  # fmt: skip
    print("| case | baseline s | target s | from scratch alone, wall s (median) | CPU s "
          "(median) | range (wall) | from scratch / target |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    record: dict = {"threads": args.threads, "rounds": args.rounds, "load_1min": load,
                    "torch": torch.__version__, "cases": {}, "gflops": gflops}  # fmt: skip
    for (name, value), baseline in zip(times.items(), args.baseline_seconds, strict=True):
        target = baseline / CASES[name][-1]
        wall, cpu = statistics.median(value["wall"]), statistics.median(value["cpu"])
        print(f"| {name} | {baseline:.1f} | {target:.2f} | {wall:.2f} | {cpu:.2f} | "
              f"{min(value['wall']):.2f}-{max(value['wall']):.2f} | {wall / target:.1f}x |")  # fmt: skip
        record["cases"][name] = {"baseline_s": baseline, "target_s": target, **value}
    for label, value in gflops.items():
        print(f"{label}: {value:.1f} GFLOP/s (median)")
    if args.json is not None:
        write_results(args.json, json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
