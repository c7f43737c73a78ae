"""Meta-training throughput: metadist's batched learner against a per-task loop.

The per-task loop is how torchmeta and learn2learn run MAML: for each task in turn,
adapt with `torch.autograd.grad(..., create_graph=True)` and accumulate the query loss,
then one backward for the batch. metadist's learner runs the same algorithm with the
tasks batched: every adapted parameter expanded to `[B, ...]`, the model run on all
tasks at once (the MLP's own `batched_forward`, batched matmuls; other models through
`vmap` of `functional_call`) and one `autograd.grad` of the summed task losses per inner
step. Both start from the same weights and see the same batches; rounds of
each are interleaved so that load from other work hits both alike. Throughput is
measured twice: per wall-clock second and per CPU second of this process
(`time.process_time`, which with one thread is the time it actually ran, so it is robust
to other work on a shared machine). The table gives medians over rounds and the ratios
of medians. metadist runs with its default metrics (which score the unadapted model on
every query set too: one more forward per task than the loop does) and with
`unadapted_metrics=False` (exactly the loop's work), both batched and with
`vectorize=False` (its own per-task loop, the fallback for models that cannot run
batched); a bare `vmap` of `torch.func.grad` with no learner around it is shown for
reference.

Workloads (Finn et al. sinusoid: meta-batch 25, K=10 support, 10 query, inner lr 0.01,
second order, MLP 1-40-40-1 ReLU, Adam 1e-3):
- `sinusoid-1`: one inner step; `sinusoid-5`: five inner steps;
- `forecaster-1`: the windowed MLP forecaster on forecast tasks of a synthetic series
  store (L=32, H=8, K=8 support and 4 query windows, hidden 64-64), one inner step.

    python benchmarks/learners.py --threads 1 --rounds 5 --steps-per-round 10
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from metadist.learners import build_learner
from metadist.models import build_model
from metadist.tasks import build_task_sampler, derive_task_seeds

META_BATCH = 25
INNER_LR = 0.01
IMPLEMENTATIONS = (
    "per-task loop",
    "metadist vectorize=False",
    "metadist vectorize=False, unadapted_metrics=False",
    "metadist batched",
    "metadist batched, unadapted_metrics=False",
    "bare torch.func vmap",
)


def per_task_loop_loss(model, batch, inner_steps: int) -> torch.Tensor:
    """Second-order MAML meta-loss, one task at a time (torchmeta / learn2learn style)."""
    initial = dict(model.named_parameters())
    total = 0.0
    for b in range(batch.num_tasks):
        params = initial
        for _ in range(inner_steps):
            loss = F.mse_loss(
                functional_call(model, params, (batch.support.x[b],)), batch.support.y[b]
            )
            grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
            params = {n: p - INNER_LR * g for (n, p), g in zip(params.items(), grads, strict=True)}
        query = functional_call(model, params, (batch.query.x[b],))
        total = total + F.mse_loss(query, batch.query.y[b])
    return total / batch.num_tasks


def bare_vmap_loss(model, batch, inner_steps: int) -> torch.Tensor:
    """The same meta-loss as a bare `vmap` of `grad` (no learner around it): the floor
    of the vmapped approach, to show what the learner's checks and metrics cost."""
    initial = dict(model.named_parameters())

    def loss(params, x, y):
        return F.mse_loss(functional_call(model, params, (x,)), y)

    def task(support_x, support_y, query_x, query_y):
        params = initial
        for _ in range(inner_steps):
            grads = torch.func.grad(loss)(params, support_x, support_y)
            params = {n: p - INNER_LR * grads[n] for n, p in params.items()}
        return loss(params, query_x, query_y)

    support, query = batch.support, batch.query
    return torch.func.vmap(task)(support.x, support.y, query.x, query.y).mean()


def sinusoid_batches(num_batches: int, seed: int):
    sampler = build_task_sampler("sinusoid", num_support=10, num_query=10)
    out = []
    for i in range(num_batches):
        positions = np.arange(i * META_BATCH, (i + 1) * META_BATCH)
        out.append(sampler.sample(positions, derive_task_seeds(seed, 0, positions)))
    return out


def forecast_batches(num_batches: int, seed: int, work_dir: Path):
    from metadist.datasets import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
    from metadist.store import SeriesStore, ingest

    panel = write_synthetic_panel(
        work_dir / "panel", num_entities=400, length_range=(200, 400), seed=seed, num_files=2
    )
    ingest(panel.out_dir, work_dir / "store", **SYNTHETIC_INGEST_ARGS, progress=False)
    store = SeriesStore.open(work_dir / "store")
    sampler = build_task_sampler(
        "forecast", store, lookback=32, horizon=8, num_support=8, num_query=4
    )
    out = []
    for i in range(num_batches):
        positions = np.arange(i * META_BATCH, (i + 1) * META_BATCH)
        units = positions % sampler.num_units
        out.append(sampler.sample(units, derive_task_seeds(seed, 0, positions)))
    return out


def make_model(workload: str, batch):
    torch.manual_seed(0)
    if workload.startswith("sinusoid"):
        return build_model("mlp", (1,), (1,), hidden_sizes=(40, 40))
    return build_model(
        "forecaster",
        tuple(batch.support.x.shape[2:]),
        tuple(batch.support.y.shape[2:]),
        hidden_sizes=(64, 64),
    )


def measure(workload: str, batches, inner_steps: int, rounds: int, steps_per_round: int):
    runners = {}
    for impl in IMPLEMENTATIONS:
        model = make_model(workload, batches[0])
        if impl in ("per-task loop", "bare torch.func vmap"):
            module = model
            plain = per_task_loop_loss if impl == "per-task loop" else bare_vmap_loss

            def loss_fn(batch, model=model, plain=plain):
                return plain(model, batch, inner_steps)
        else:
            module = build_learner(
                "maml",
                model,
                inner_steps=inner_steps,
                inner_lr=INNER_LR,
                vectorize="vectorize=False" not in impl,
                unadapted_metrics="unadapted_metrics=False" not in impl,
            )

            def loss_fn(batch, module=module):
                return module(batch).loss

        runners[impl] = (loss_fn, torch.optim.Adam(module.parameters(), lr=1e-3))

    first = {impl: fn(batches[0]).item() for impl, (fn, _) in runners.items()}
    cursor = {impl: 0 for impl in runners}

    def run(impl, num_steps):
        fn, optimizer = runners[impl]
        for _ in range(num_steps):
            batch = batches[cursor[impl] % len(batches)]
            cursor[impl] += 1
            optimizer.zero_grad(set_to_none=True)
            fn(batch).backward()
            optimizer.step()

    for impl in runners:
        run(impl, 3)  # warm-up
    rates = {impl: {"wall": [], "cpu": []} for impl in runners}
    for _ in range(rounds):
        for impl in runners:
            wall, cpu = time.perf_counter(), time.process_time()
            run(impl, steps_per_round)
            num_tasks = steps_per_round * META_BATCH
            rates[impl]["wall"].append(num_tasks / (time.perf_counter() - wall))
            rates[impl]["cpu"].append(num_tasks / (time.process_time() - cpu))
    return first, rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workloads", nargs="+", default=["sinusoid-1", "sinusoid-5", "forecaster-1"]
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "learners.json"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads:
            kind, steps = workload.rsplit("-", 1)
            if kind == "sinusoid":
                batches = sinusoid_batches(8, args.seed)
            else:
                batches = forecast_batches(8, args.seed, Path(tmp))
            first, rates = measure(workload, batches, int(steps), args.rounds, args.steps_per_round)
            medians = {
                impl: {clock: statistics.median(r[clock]) for clock in ("wall", "cpu")}
                for impl, r in rates.items()
            }
            base = medians["per-task loop"]
            shape = f"x {tuple(batches[0].support.x.shape)} y {tuple(batches[0].support.y.shape)}"
            for impl, median in medians.items():
                cpu = rates[impl]["cpu"]
                rows.append(
                    f"| {workload} | {impl} | {median['cpu']:,.0f} | "
                    f"{min(cpu):,.0f}–{max(cpu):,.0f} | **{median['cpu'] / base['cpu']:.1f}×** | "
                    f"{median['wall']:,.0f} | {median['wall'] / base['wall']:.1f}× |"
                )
            spread = max(first.values()) - min(first.values())
            records.append(
                {
                    "workload": workload,
                    "support": shape,
                    "tasks_per_s": rates,
                    "medians": medians,
                    "first_meta_loss": first,
                }
            )
            print(
                f"{workload}: {shape}; first meta-losses agree within {spread:.1e}",
                flush=True,
            )
    print(
        f"\ntorch {torch.__version__}, {args.threads} thread(s), {platform.machine()}, "
        f"{args.rounds} rounds × {args.steps_per_round} meta-steps × {META_BATCH} tasks\n"
    )
    print(
        "| workload | implementation | tasks per CPU-s (median) | range over rounds "
        "| vs per-task loop | tasks per wall-s (median) | vs per-task loop |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "threads": args.threads,
                "rounds": args.rounds,
                "steps_per_round": args.steps_per_round,
                "torch": torch.__version__,
                "results": records,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
