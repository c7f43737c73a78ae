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
reference. `torch.compile(learner)` compiles the batched learner with Inductor as
`trainer.compile=true` does on the CPU (`metadist.train.step.compile_options`: the C++
wrapper; it can compile since the MLP writes out its inner gradient, `MLP.batched_vjp`: no
double backward; earlier code fails at its first step, which the table then leaves out
with the error printed). The `MetaStep` rows are the trainer's own meta-step
(`metadist.train.step.MetaStep`: the step guard, reading its verdict every step as on the
CPU by default), eager and with `trainer.compile=true`. The first two steps, where the
compilation happens, are timed apart and not in the rates.

Workloads (Finn et al. sinusoid: meta-batch 25, K=10 support, 10 query, inner lr 0.01,
second order, MLP 1-40-40-1 ReLU, Adam 1e-3):
- `sinusoid-1`: one inner step; `sinusoid-5`: five inner steps;
- `forecaster-1`: the windowed MLP forecaster on forecast tasks of a synthetic series
  store (L=32, H=8, K=8 support and 4 query windows, hidden 64-64), one inner step;
- `competition-1`: the `competition_cpu` recipe's model and learner on forecast tasks of
  that store: the seasonal forecaster (hidden 256-256-256, m=4, multiplicative, clamp 1,
  L=16, H=8; `model=seasonal_forecaster`), meta-batch 64, K=4 support and 1 query
  window, second-order MAML with one learned inner step (inner lr 0.05) on sMAPE (the
  per-task loop, the reference of the ratios, stays the sinusoid's MSE loop).

    python benchmarks/learners.py --threads 1 --rounds 5 --steps-per-round 10

Side by side with earlier code: `--baseline DIR` names a checkout of it (`git worktree
add /tmp/learners_before COMMIT`); each tree then runs in its own persistent worker
process (this script with `PYTHONPATH` set to the tree, so both use this harness and this
reference loop), one round in each tree in turn, and every ratio is against the per-task
loop of its own process. `--optimizer adam-fused` gives every implementation Adam with
`fused=True` (default: torch's default Adam, one tensor at a time on the CPU).
`--implementations` runs only the rows named (and the per-task loop).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from torch.func import functional_call

import metadist
from metadist.learners import build_learner
from metadist.models import build_model
from metadist.tasks import build_task_sampler, derive_task_seeds
from metadist.train.distributed import DistEnv
from metadist.train.step import MetaStep

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, output_file, script_parser  # noqa: E402
from written import write_results  # noqa: E402

META_BATCH = 25
INNER_LR = 0.01
# competition-1 (the competition_cpu recipe): meta-batch, sampler, model, learner
COMPETITION_BATCH = 64
COMPETITION_TASKS = {"lookback": 16, "horizon": 8, "num_support": 4, "num_query": 1}
COMPETITION_MODEL = {"hidden_sizes": (256, 256, 256), "window_norm": "seasonal",
                     "target_channels": [0], "seasonal_period": 4, "clamp": 1.0}  # fmt: skip
COMPETITION_LEARNER = {"inner_lr": 0.05, "learn_inner_lr": True, "loss": "smape"}


def meta_batch(workload: str) -> int:
    return COMPETITION_BATCH if workload.startswith("competition") else META_BATCH


IMPLEMENTATIONS = (
    "per-task loop",
    "metadist vectorize=False",
    "metadist vectorize=False, unadapted_metrics=False",
    "metadist batched",
    "metadist batched, unadapted_metrics=False",
    "metadist batched, torch.compile(learner)",
    "metadist MetaStep, trainer.compile=false",
    "metadist MetaStep, trainer.compile=true",
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


def forecast_batches(num_batches: int, seed: int, work_dir: Path, workload: str = "forecaster"):
    from metadist.datasets import SYNTHETIC_INGEST_ARGS, SYNTHETIC_TARGET, write_synthetic_panel
    from metadist.store import SeriesStore, ingest

    panel = write_synthetic_panel(
        work_dir / "panel", num_entities=400, length_range=(200, 400), seed=seed, num_files=2
    )
    ingest(panel.out_dir, work_dir / "store", **SYNTHETIC_INGEST_ARGS, progress=False)
    store = SeriesStore.open(work_dir / "store")
    tasks = {"lookback": 32, "horizon": 8, "num_support": 8, "num_query": 4}
    if workload.startswith("competition"):
        # the value alone, as the competition stores hold
        columns = [SYNTHETIC_TARGET]
        tasks = {**COMPETITION_TASKS, "target_columns": columns, "input_columns": columns}
    sampler = build_task_sampler("forecast", store, **tasks)
    size = meta_batch(workload)
    out = []
    for i in range(num_batches):
        positions = np.arange(i * size, (i + 1) * size)
        units = positions % sampler.num_units
        out.append(sampler.sample(units, derive_task_seeds(seed, 0, positions)))
    return out


def make_model(workload: str, batch):
    torch.manual_seed(0)
    if workload.startswith("sinusoid"):
        return build_model("mlp", (1,), (1,), hidden_sizes=(40, 40))
    if workload.startswith("competition"):
        shapes = tuple(batch.support.x.shape[2:]), tuple(batch.support.y.shape[2:])
        return build_model("forecaster", *shapes, **COMPETITION_MODEL)
    return build_model(
        "forecaster",
        tuple(batch.support.x.shape[2:]),
        tuple(batch.support.y.shape[2:]),
        hidden_sizes=(64, 64),
    )


def make_optimizer(kind: str, parameters):
    """Adam 1e-3: torch's default on the CPU (one tensor at a time) or `fused=True`."""
    return torch.optim.Adam(parameters, lr=1e-3, fused=kind == "adam-fused")


def cpu_compile(module):
    """`torch.compile` as `trainer.compile=true` calls it on the CPU (`compile_options`:
    Inductor's C++ wrapper); plain `torch.compile` in a tree from before it existed."""
    try:
        from metadist.train.step import compile_options
    except ImportError:  # an earlier tree (--baseline)
        return torch.compile(module)
    return torch.compile(module, **compile_options(torch.device("cpu")))


def trainer_step(learner, optimizer, compile: bool):
    """A step of the trainer's own `MetaStep` (`trainer.compile`, the step guard with its
    CPU default of reading the verdict every step), as `metadist train` runs it."""
    meta_step = MetaStep(
        learner, learner, optimizer, DistEnv(), compile=compile,
        message=lambda line: print(line, file=sys.stderr),  # stdout is the worker's pipe
    )  # fmt: skip
    count = [0]

    def step(batch):
        reading = meta_step(batch, count[0], 1e-3, sync=True)
        count[0] += 1
        return torch.tensor(reading.loss)

    return step


def plain_step(loss_fn, optimizer):
    """zero_grad, the meta-loss, its backward, the update; returns the meta-loss."""

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(batch)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def build_runners(workload: str, batches, inner_steps: int, optimizer: str, implementations):
    """Implementation name → a meta-step function of a batch (forward, backward and
    update; returns the meta-loss before the update), all from the same weights."""
    runners = {}
    for impl in implementations:
        model = make_model(workload, batches[0])
        if impl in ("per-task loop", "bare torch.func vmap"):
            plain = per_task_loop_loss if impl == "per-task loop" else bare_vmap_loss

            def loss_fn(batch, model=model, plain=plain):
                return plain(model, batch, inner_steps)

            runners[impl] = plain_step(loss_fn, make_optimizer(optimizer, model.parameters()))
            continue
        options = {"inner_lr": INNER_LR}
        if workload.startswith("competition"):
            options = COMPETITION_LEARNER
        module = build_learner(
            "maml",
            model,
            inner_steps=inner_steps,
            vectorize="vectorize=False" not in impl,
            unadapted_metrics="unadapted_metrics=False" not in impl,
            **options,
        )
        opt = make_optimizer(optimizer, module.parameters())
        if "MetaStep" in impl:
            runners[impl] = trainer_step(module, opt, compile="compile=true" in impl)
            continue
        call = cpu_compile(module) if "torch.compile" in impl else module

        def loss_fn(batch, call=call):
            return call(batch).loss

        runners[impl] = plain_step(loss_fn, opt)
    return runners


class Rounds:
    """Runs rounds of meta-steps of every implementation (one after the other) on the
    batches in turn, after 3 warm-up steps each (`torch.compile` compiles in the first
    or, in `MetaStep`, the second); `first` holds the first meta-losses, `failed` the
    implementations whose first steps raised (one line each; they are left out)."""

    def __init__(
        self, workload: str, batches, inner_steps: int, optimizer: str, implementations
    ) -> None:
        self.batches = batches
        self.num_tasks = meta_batch(workload)
        self.runners = build_runners(workload, batches, inner_steps, optimizer, implementations)
        self.first, self.failed, self.compile_s = {}, {}, {}
        for impl, step in list(self.runners.items()):
            start = time.perf_counter()
            try:
                self.first[impl] = step(batches[0]).item()
                step(batches[1])  # where the trainer's MetaStep compiles
            except Exception as error:  # noqa: BLE001 - reported, e.g. no double backward
                self.failed[impl] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                self.first.pop(impl, None)
                del self.runners[impl]
                continue
            self.compile_s[impl] = time.perf_counter() - start
        self.cursor = {impl: 2 for impl in self.runners}
        for impl in self.runners:
            self.run(impl, 3)

    def run(self, impl: str, num_steps: int) -> None:
        step = self.runners[impl]
        for _ in range(num_steps):
            step(self.batches[self.cursor[impl] % len(self.batches)])
            self.cursor[impl] += 1

    def round(self, steps_per_round: int) -> dict[str, dict[str, float]]:
        """Tasks per wall-second and per CPU-second of each implementation, one round."""
        out = {}
        for impl in self.runners:
            wall, cpu = time.perf_counter(), time.process_time()
            self.run(impl, steps_per_round)
            num_tasks = steps_per_round * self.num_tasks
            out[impl] = {
                "wall": num_tasks / (time.perf_counter() - wall),
                "cpu": num_tasks / (time.process_time() - cpu),
            }
        return out


def worker(args) -> None:
    """`--worker`: the implementations of the metadist on `PYTHONPATH`, one round per
    "round" line read on stdin, its rates printed as one JSON line (see `--baseline`)."""
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        rounds = Rounds(
            args.worker,
            load_batches(args.worker, args.seed, Path(tmp)),
            workload_steps(args.worker),
            args.optimizer,
            args.implementations,
        )
        package = str(Path(metadist.__file__).parent)
        hello = {"first": rounds.first, "failed": rounds.failed, "metadist": package,
                 "first_step_s": rounds.compile_s}  # fmt: skip
        print(json.dumps(hello), flush=True)
        for line in sys.stdin:
            if line.strip() != "round":
                break
            print(json.dumps(rounds.round(args.steps_per_round)), flush=True)


def measure_trees(workload: str, trees: dict[str, Path], args):
    """The rounds of a workload interleaved over metadist trees (label → checkout): one
    persistent `--worker` process per tree, each round run in every tree in turn."""
    workers = {}
    for label, root in trees.items():
        env = {**os.environ, "PYTHONPATH": str(root)}
        command = [sys.executable, __file__, "--worker", workload, "--threads", str(args.threads),
                   "--steps-per-round", str(args.steps_per_round), "--seed", str(args.seed),
                   "--optimizer", args.optimizer, "--implementations", *args.implementations]  # fmt: skip
        workers[label] = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
    try:
        first = {}
        for label, proc in workers.items():
            hello = json.loads(proc.stdout.readline())
            print(f"{label}: metadist from {hello['metadist']}", flush=True)
            for impl, loss in hello["first"].items():
                first[f"{label}: {impl}"] = loss
            report_first_steps(label, hello["failed"], hello["first_step_s"])
        rates = {key: {"wall": [], "cpu": []} for key in first}
        for _ in range(args.rounds):
            for label, proc in workers.items():
                proc.stdin.write("round\n")
                proc.stdin.flush()
                for impl, rate in json.loads(proc.stdout.readline()).items():
                    for clock in ("wall", "cpu"):
                        rates[f"{label}: {impl}"][clock].append(rate[clock])
    finally:
        for proc in workers.values():
            proc.stdin.close()
            proc.wait(timeout=60)
    return first, rates


def report_first_steps(label: str, failed: dict[str, str], first_step_s: dict[str, float]):
    for impl, error in failed.items():
        print(f"{label}: {impl} FAILED at its first step, left out: {error}", flush=True)
    for impl, seconds in first_step_s.items():
        if "compile" in impl and "compile=false" not in impl:
            print(f"{label}: {impl}: first two steps (compiling) {seconds:.0f} s", flush=True)


def measure(workload: str, batches, inner_steps: int, args):
    runs = Rounds(workload, batches, inner_steps, args.optimizer, args.implementations)
    report_first_steps("this tree", runs.failed, runs.compile_s)
    rates = {impl: {"wall": [], "cpu": []} for impl in runs.runners}
    for _ in range(args.rounds):
        for impl, rate in runs.round(args.steps_per_round).items():
            for clock in ("wall", "cpu"):
                rates[impl][clock].append(rate[clock])
    return runs.first, rates


def workload_steps(workload: str) -> int:
    return int(workload.rsplit("-", 1)[1])


def workload_arg(text: str) -> str:
    """`--workloads`: KIND-STEPS, KIND one of sinusoid, forecaster, competition and STEPS
    the inner steps (at least 1)."""
    kind, _, steps = text.rpartition("-")
    if kind not in ("sinusoid", "forecaster", "competition") or not steps.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a workload: sinusoid-N, forecaster-N or competition-N"
        )
    count(steps)
    return text


def load_batches(workload: str, seed: int, work_dir: Path):
    if workload.startswith("sinusoid"):
        return sinusoid_batches(8, seed)
    return forecast_batches(8, seed, work_dir, workload)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--rounds", type=count, default=5)
    parser.add_argument("--steps-per-round", type=count, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workloads",
        nargs="+",
        type=workload_arg,
        default=["sinusoid-1", "sinusoid-5", "forecaster-1"],
    )
    parser.add_argument("--optimizer", choices=("adam", "adam-fused"), default="adam")
    parser.add_argument(
        "--implementations",
        nargs="+",
        choices=IMPLEMENTATIONS,
        default=list(IMPLEMENTATIONS),
        metavar="NAME",
        help="which rows to run (the per-task loop always runs: every ratio is against it); "
        f"default all: {'; '.join(IMPLEMENTATIONS)}",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of earlier code (git worktree add DIR COMMIT): its metadist runs "
        "beside this tree's, each in its own process, rounds interleaved",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--out", type=output_file, default=Path(__file__).parent / "results" / "learners.json"
    )
    args = parser.parse_args()
    if "per-task loop" not in args.implementations:
        args.implementations.insert(0, "per-task loop")
    # a shared machine: Inductor compiles in this process, not in a pool of workers
    inductor_config.compile_threads = 1
    if args.worker:
        worker(args)
        return
    if args.baseline is not None and not (args.baseline / "metadist" / "__init__.py").is_file():
        parser.error(f"--baseline {args.baseline}: no metadist package there")
    torch.set_num_threads(args.threads)
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads:
            load_before = os.getloadavg()[0]
            if args.baseline is None:
                batches = load_batches(workload, args.seed, Path(tmp))
                first, rates = measure(workload, batches, workload_steps(workload), args)
            else:
                trees = {"this tree": Path(__file__).resolve().parents[1]}
                trees[f"baseline {tree_commit(args.baseline)}"] = args.baseline
                first, rates = measure_trees(workload, trees, args)
            load = (load_before, os.getloadavg()[0])
            rows += table_rows(workload, rates)
            spread = max(first.values()) - min(first.values())
            records.append({"workload": workload, "load_1min": load, "tasks_per_s": rates,
                            "first_meta_loss": first})  # fmt: skip
            print(f"{workload}: first meta-losses agree within {spread:.1e}; "
                  f"load {load[0]:.1f} → {load[1]:.1f}", flush=True)  # fmt: skip
    print(
        f"\ntorch {torch.__version__}, {args.threads} thread(s), {platform.machine()}, "
        f"{args.rounds} rounds × {args.steps_per_round} meta-steps × {META_BATCH} tasks "
        f"({COMPETITION_BATCH} for competition-1), "
        f"{args.optimizer}\n"
    )
    print(
        "| workload | implementation | tasks per CPU-s (median) | range over rounds "
        "| vs per-task loop | tasks per wall-s (median) | vs per-task loop |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    summary = {"threads": args.threads, "rounds": args.rounds, "optimizer": args.optimizer,
               "steps_per_round": args.steps_per_round, "torch": torch.__version__}  # fmt: skip
    write_results(args.out, json.dumps({**summary, "results": records}, indent=2))


def table_rows(workload: str, rates) -> list[str]:
    """Markdown rows: medians over rounds, each against the per-task loop of its own
    process (the same code in every tree)."""
    rows = []
    for key, rate in rates.items():
        prefix = key.rsplit(": ", 1)[0] + ": " if ": " in key else ""
        base = rates[prefix + "per-task loop"]
        median = {clock: statistics.median(rate[clock]) for clock in ("wall", "cpu")}
        ratio = {clock: median[clock] / statistics.median(base[clock]) for clock in median}
        cpu = rate["cpu"]
        rows.append(
            f"| {workload} | {key} | {median['cpu']:,.0f} | {min(cpu):,.0f}–{max(cpu):,.0f} "
            f"| **{ratio['cpu']:.1f}×** | {median['wall']:,.0f} | {ratio['wall']:.1f}× |"
        )
    return rows


def tree_commit(root: Path) -> str:
    """The short commit of a checkout, or its path where git cannot say."""
    result = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip() or str(root)


if __name__ == "__main__":
    main()
