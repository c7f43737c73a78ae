"""Reproduces the sinusoid regression experiment of Finn et al. (2017, section 5.1).

Meta-trains MAML, first-order MAML and Meta-SGD for the paper's budget (70,000
meta-steps; meta-batch 25 tasks, K=10 support and 10 query points, one inner step at
0.01, MLP 1-40-40-1 ReLU, Adam 1e-3), plus a "pretrained" baseline (the same network
trained with Adam on the pooled points of the same tasks, then fine-tuned by the same
inner SGD), then scores every model on 2,000 fresh tasks for K = 5, 10, 20 shots after
0..10 inner steps (query: 100 evenly spaced points on [-5, 5]).

Each model's results land in `OUT/<name>.json` as soon as it finishes, so a run cut
short keeps what it finished; `--time-budget-s` stops a model's training early and
records the number of meta-steps actually run. `--report` turns the JSON files into
the markdown table and the plot.

    python benchmarks/sinusoid_reproduction.py --steps 70000
    python benchmarks/sinusoid_reproduction.py --report
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from metadist.durable import atomic_file
from metadist.learners import build_learner
from metadist.models import build_model
from metadist.tasks import build_task_sampler, derive_task_seeds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, positive, script_parser  # noqa: E402
from written import write_results  # noqa: E402

META_BATCH = 25
TRAIN_SHOTS = 10
INNER_LR = 0.01
SHOTS = (5, 10, 20)
EVAL_STEPS = tuple(range(11))
DIVERGED_MSE = 100.0  # E[y²] = A²/2 ≤ 12.5, so predicting 0 already scores below this.
MODELS = {
    "maml": ("maml", {}),
    "fomaml": ("maml", {"first_order": True}),
    "metasgd": ("metasgd", {}),
    "pretrained": (None, {}),
}
DEFAULT_OUT = Path(__file__).parent / "results" / "sinusoid_reproduction"


def make_learner(name: str, seed: int):
    torch.manual_seed(seed)
    model = build_model("mlp", (1,), (1,), hidden_sizes=(40, 40))
    learner_name, options = MODELS[name]
    if learner_name is None:  # fine-tuning the pretrained network is plain SGD = MAML's inner loop
        learner_name, options = "maml", {}
    return build_learner(learner_name, model, inner_steps=1, inner_lr=INNER_LR, **options)


def train(name: str, num_steps: int, seed: int, time_budget_s: float, log_every: int):
    learner = make_learner(name, seed)
    sampler = build_task_sampler("sinusoid", num_support=TRAIN_SHOTS, num_query=TRAIN_SHOTS)
    optimizer = torch.optim.Adam(learner.parameters(), lr=1e-3)
    start = time.perf_counter()
    steps_run = 0
    for step in range(num_steps):
        positions = np.arange(step * META_BATCH, (step + 1) * META_BATCH)
        batch = sampler.sample(positions, derive_task_seeds(seed, 0, positions))
        if name == "pretrained":
            x = torch.cat([batch.support.x, batch.query.x], dim=1)
            y = torch.cat([batch.support.y, batch.query.y], dim=1)
            loss = torch.nn.functional.mse_loss(learner.model(x), y)
        else:
            loss = learner(batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps_run = step + 1
        elapsed = time.perf_counter() - start
        if log_every and steps_run % log_every == 0:
            print(
                f"{name}: step {steps_run}/{num_steps} loss {loss.item():.4f} ({elapsed:.0f} s)",
                flush=True,
            )
        if elapsed > time_budget_s:
            print(f"{name}: time budget reached after {steps_run} steps", flush=True)
            break
    return learner, steps_run, time.perf_counter() - start


@torch.no_grad()
def evaluate(learner, num_tasks: int, seed: int) -> dict:
    learner.eval()
    learner.check_finite = False  # diverging K=5 tasks are part of the measurement
    results = {}
    for shots in SHOTS:
        sampler = build_task_sampler("sinusoid", num_support=shots, num_query=100, query_grid=True)
        positions = np.arange(num_tasks)
        # Same seeds for every K: the same 2,000 functions, only the number of shots differs.
        batch = sampler.sample(positions, derive_task_seeds(seed + 1000, 0, positions))
        per_steps = {}
        for steps in EVAL_STEPS:
            params = learner.adapt(batch.support, steps=steps)
            prediction = learner.predict(params, batch.query.x)
            mse = ((prediction - batch.query.y) ** 2).mean(dim=(1, 2)).double().numpy()
            diverged = ~np.isfinite(mse) | (mse > DIVERGED_MSE)
            mse = np.where(np.isnan(mse), np.inf, mse)  # a NaN task counts as diverged, not unknown
            per_steps[str(steps)] = {
                "mean": float(np.mean(mse)),
                "median": float(np.median(mse)),
                "mean_converged": float(np.mean(mse[~diverged])) if (~diverged).any() else None,
                "num_diverged": int(diverged.sum()),
            }
        results[str(shots)] = per_steps
    return results


def run(args) -> None:
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        learner, steps_run, seconds = train(
            name, args.steps, args.seed, args.time_budget_s, args.log_every
        )
        results = evaluate(learner, args.eval_tasks, args.seed)
        record = {
            "model": name,
            "steps_requested": args.steps,
            "steps_run": steps_run,
            "train_seconds": seconds,
            "seconds_per_step": seconds / max(steps_run, 1),
            "threads": args.threads,
            "seed": args.seed,
            "eval_tasks": args.eval_tasks,
            "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(),
            "results": results,
        }
        if name == "metasgd":
            lrs = torch.cat([p.detach().flatten() for p in learner.inner_lrs.values()])
            record["learned_lr"] = {
                "mean": lrs.mean().item(),
                "min": lrs.min().item(),
                "max": lrs.max().item(),
            }
        with atomic_file(args.out / f"{name}.pt") as temporary:
            torch.save(learner.state_dict(), temporary)
        write_results(args.out / f"{name}.json", json.dumps(record, indent=2))
        k1 = results["10"]["1"]["mean"]
        print(
            f"{name}: done, {steps_run} steps in {seconds:.0f} s; K=10 1-step MSE {k1:.3f}",
            flush=True,
        )


def report(out: Path) -> None:
    records = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    if not records:
        raise SystemExit(f"sinusoid_reproduction: --report: no results in {out} (run it first)")
    order = [m for m in MODELS if m in records]
    lines = [
        "| model | meta-steps | s/step | K | 0 steps mean / median | 1 step mean / median "
        "| 10 steps mean / median |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in order:
        rec = records[name]
        for shots in SHOTS:
            r = rec["results"][str(shots)]

            def cell(steps, r=r, tasks=rec["eval_tasks"]):
                c = r[str(steps)]
                if c["num_diverged"]:
                    # A mean over diverged tasks is not a result: say how many diverged.
                    return (
                        f"diverged on {c['num_diverged']:,} of {tasks:,} (median "
                        f"{_fmt(c['median'])})"
                    )
                return f"{_fmt(c['mean'])} / {_fmt(c['median'])}"

            lines.append(
                f"| {name} | {rec['steps_run']:,} | {rec['seconds_per_step'] * 1e3:.1f} ms "
                f"| {shots} | {cell(0)} | {cell(1)} | {cell(10)} |"
            )
    print("\n".join(lines))
    _plot(records, order, out / "sinusoid_reproduction.png")


def _fmt(value) -> str:
    if value is None or not math.isfinite(value):
        return "not finite"
    return f"{value:.3f}" if value < 100 else f"{value:.3g}"


def _plot(records: dict, order: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SHOTS), figsize=(4.2 * len(SHOTS), 3.4), sharey=False)
    for ax, shots in zip(axes, SHOTS, strict=True):
        for name in order:
            r = records[name]["results"][str(shots)]
            # Points where over half of the tasks diverged have no meaningful median.
            medians = [r[str(s)]["median"] for s in EVAL_STEPS]
            medians = [m if m <= DIVERGED_MSE else float("nan") for m in medians]
            ax.plot(EVAL_STEPS, medians, marker="o", markersize=3, label=name)
        ax.set_title(f"K = {shots}")
        ax.set_xlabel("inner gradient steps (lr 0.01)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("median query MSE, 2,000 tasks")
    axes[-1].legend()
    fig.tight_layout()
    with atomic_file(path) as temporary:
        fig.savefig(temporary, dpi=110, format="png")
    print(f"plot: {path}")


def _budget(text: str) -> float:
    """`--time-budget-s`: seconds above 0, or inf (no budget, the default)."""
    return float("inf") if text == "inf" else positive(text)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--steps", type=count, default=70_000)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--eval-tasks", type=count, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--time-budget-s", type=_budget, default=float("inf"))
    parser.add_argument("--log-every", type=count, default=5000)
    parser.add_argument("--out", type=directory, default=DEFAULT_OUT)
    parser.add_argument("--report", action="store_true", help="table + plot from OUT/*.json")
    args = parser.parse_args()
    if args.report:
        report(args.out)
    else:
        run(args)


if __name__ == "__main__":
    main()
