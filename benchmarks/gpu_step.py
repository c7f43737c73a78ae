"""The batched meta-step alone on a GPU: ms a step, and the host syncs of steps that do
not read the step guard.

`benchmarks/gpu.py` times whole workloads against the per-task loop and the CPU; this
times only `MetaStep` as configured (reading the guard every 16 steps on CUDA) so that
two versions of the step can be compared side by side: run it from each checkout in
turn, alternating, in one session on one machine.

    python benchmarks/gpu_step.py                       # in this checkout
    (cd OLD && PYTHONPATH=$PWD python NEW/benchmarks/gpu_step.py)   # an older checkout

For each workload (`benchmarks/gpu.py`'s): medians of `--rounds` rounds of `--steps`
steps after a warm-up; then `--unread` steps with `torch.cuda.set_sync_debug_mode("warn")`
none of which reads the guard, and every host sync they caused, by source line.
"""

from __future__ import annotations

import collections
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd() / "benchmarks"))  # the checkout's own gpu.py
import gpu  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, non_negative, script_parser  # noqa: E402


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--workloads",
        nargs="+",
        # an earlier checkout's gpu.py (the baseline's run, from its directory) has no check
        type=getattr(gpu, "workload_arg", str),
        default=["sinusoid-25", "forecaster-64", "anil-64", "sinusoid-4096"],
    )
    parser.add_argument("--rounds", type=count, default=5)
    parser.add_argument("--steps", type=count, default=32)
    parser.add_argument(
        "--unread", type=non_negative, default=14, help="steps checked for host syncs"
    )
    parser.add_argument("--entities", type=count, default=100, help="synthetic store size")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("no GPU is visible: this benchmark times the CUDA step")
    device = torch.device("cuda")
    store = gpu.build_store(Path(tempfile.mkdtemp()), args.entities)
    for name in args.workloads:
        runner = gpu.Runner(gpu.workload_overrides(name, store, 4096), device)
        runner.run(8)
        times = []
        for _ in range(args.rounds):
            torch.cuda.synchronize()
            start = time.perf_counter()
            runner.run(args.steps)
            times.append((time.perf_counter() - start) / args.steps * 1e3)
        runner.count = 1  # the steps after a read: none of the next 14 reads the guard
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            for i in range(args.unread):
                batch = runner.batches[i % len(runner.batches)]
                runner.step(batch, runner.count, gpu.LR, sync=False)
                runner.count += 1
            torch.cuda.set_sync_debug_mode(0)
        syncs = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught)
        print(
            f"{name}: {statistics.median(times):.3f} ms/step (rounds "
            f"{[round(t, 3) for t in times]}); host syncs in {args.unread} unread steps: "
            f"{sum(syncs.values())} {dict(syncs)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
