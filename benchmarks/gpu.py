"""Meta-training throughput on a GPU: batched learners against the per-task loop and the CPU.

For each workload the training step (`metadist.train.step.MetaStep`: forward, backward,
step guard, Adam update) is timed

- batched on `--device` (the learner as configured, tasks run together),
- as the per-task loop on the same device (the same learner with `vectorize=False`, one
  task at a time, which is how torchmeta/learn2learn run; its rate does not depend on B,
  so at large B it is timed on the first `--loop-tasks` tasks of each batch),
- batched on the CPU (`--cpu-threads` intra-op threads), the CPU figure,
- fed by the real loader (`BatchMetaDataLoader` → pinned batch → non-blocking copy →
  step), with the share of wall time the host spent waiting for the next batch: when the
  fed rate is well below the step-only rate, the loader is the bottleneck,
- optionally compiled (`--compile`: `torch.compile`, `reduce-overhead` on CUDA; second-
  order MAML cannot compile — no double backward through compiled graphs — and the row
  says it fell back).

GPU utilisation is sampled (pynvml, else `nvidia-smi`) while the batched and fed steps
run. Rounds of the implementations are interleaved; the table gives medians over rounds.
`--losses N` also trains each sinusoid/forecaster workload N steps in fp32 and in bf16
autocast from the same start on the same batches and reports the mean loss of the last
tenth of the steps.

Workloads: `sinusoid-25`, `sinusoid-4096` (Finn et al.: MLP 1-40-40-1, second-order MAML,
one inner step, K=10+10), `forecaster-64` (windowed MLP forecaster 64-64 on forecast tasks
of a synthetic store, L=32, H=8, K=8+4, second-order MAML), `anil-64` (ANIL, same tasks and
model), `protonet-32` (Prototypical Networks, 5-way 1-shot windows of the synthetic store's
profiles, MLP embedding). The number is the meta-batch B.

    python benchmarks/gpu.py --device cuda                      # on the GPU machine
    python benchmarks/gpu.py --device cpu --rounds 2 --steps 2 --sinusoid-large 256  # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from metadist.train import load_config
from metadist.train.build import build_parts
from metadist.train.distributed import DistEnv
from metadist.train.step import MetaStep

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, non_negative, script_parser  # noqa: E402
from written import write_results  # noqa: E402

LR = 1e-3
WORKLOAD_KINDS = ("sinusoid", "forecaster", "forecaster-fo", "anil", "protonet")


def workload_overrides(
    name: str, store: Path | None, large: int, num_workers: int = 0
) -> list[str]:
    kind, batch = name.rsplit("-", 1)
    batch_size = large if name == "sinusoid-4096" else int(batch)
    common = [
        f"trainer.meta_batch_size={batch_size}",
        "trainer.eval_every=0",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        f"optimizer.lr={LR}",
        f"data.num_workers={num_workers}",
        f"data.persistent_workers={str(num_workers > 0).lower()}",
    ]
    if kind == "sinusoid":
        return ["experiment=sinusoid_maml", f"sampler.options.num_tasks={10 * batch_size}", *common]
    stored = [f"data.store={store}", "++data.verify_store=false", *common]
    if kind == "forecaster":
        return ["experiment=synthetic_maml", *stored]
    if kind == "forecaster-fo":
        return ["experiment=synthetic_maml", "learner=fomaml", *stored]
    if kind == "anil":
        return ["experiment=synthetic_maml", "learner=anil", *stored]
    if kind == "protonet":
        return ["experiment=synthetic_protonet", *stored]
    raise ValueError(f"unknown workload {name!r}")


def workload_arg(text: str) -> str:
    """`--workloads`: KIND-B, KIND one of the kinds `workload_overrides` knows and B the
    meta-batch size (at least 1)."""
    kind, _, batch = text.rpartition("-")
    if kind not in WORKLOAD_KINDS or not batch.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a workload: KIND-B, KIND one of {', '.join(WORKLOAD_KINDS)}"
        )
    count(batch)
    return text


def build_store(work_dir: Path, num_entities: int) -> Path:
    from metadist.datasets import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
    from metadist.store import ingest

    panel = write_synthetic_panel(
        work_dir / "panel", num_entities=num_entities, length_range=(200, 400), num_files=2
    )
    ingest(panel.out_dir, work_dir / "store", **SYNTHETIC_INGEST_ARGS, progress=False)
    return work_dir / "store"


class Runner:
    """One implementation of a workload: its learner, optimizer, step and batches."""

    def __init__(self, overrides, device, *, vectorize=True, compile=False, precision="fp32",
                 check_every=None, num_batches=8, num_tasks=None):  # fmt: skip
        options = [*overrides, f"++learner.options.vectorize={str(vectorize).lower()}"]
        options.append(f"trainer.device={'cpu' if device.type == 'cpu' else 'cuda'}")
        self.config = load_config(options, world_size=1)
        self.device = device
        self.env = DistEnv(device=device)
        torch.manual_seed(0)
        self.parts = build_parts(self.config, self.env)
        self.batch_size = self.config.trainer.meta_batch_size
        if check_every is None:
            check_every = 1 if device.type == "cpu" else 16
        self.check_every = check_every
        self.messages: list[str] = []
        self.step = MetaStep(
            self.parts.learner,
            self.parts.learner,
            self.parts.optimizer,
            self.env,
            check_every=check_every,
            compile=compile,
            precision=precision,
            message=self.messages.append,
        )
        self.batches = []
        for batch in _epochs(self.parts.train_loader, num_batches):
            if num_tasks is not None and num_tasks < batch.num_tasks:
                batch = batch.select(slice(0, num_tasks))
            self.batches.append(batch.to(device))
        self.tasks_per_step = self.batches[0].num_tasks
        self.count = 0

    def run(self, num_steps: int) -> float:
        """`num_steps` meta-steps on the prepared batches; returns the last loss."""
        reading = None
        for i in range(num_steps):
            sync = i == num_steps - 1 or (self.count + 1) % self.check_every == 0
            batch = self.batches[self.count % len(self.batches)]
            reading = self.step(batch, self.count, LR, sync=sync) or reading
            self.count += 1
        _synchronize(self.device)
        if reading.bad_step is not None:
            raise RuntimeError(f"non-finite meta-loss at step {reading.bad_step}")
        return reading.loss

    def fed(self, num_steps: int) -> tuple[float, float]:
        """`(tasks/s, share of wall time waiting for the loader)` through the real loader."""
        waited, done = 0.0, 0
        start = time.perf_counter()
        while done < num_steps:
            batches = iter(self.parts.train_loader)
            while done < num_steps:
                before = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                batch = batch.to(self.device, non_blocking=True)
                waited += time.perf_counter() - before
                sync = done == num_steps - 1 or (self.count + 1) % self.check_every == 0
                self.step(batch, self.count, LR, sync=sync)
                self.count += 1
                done += 1
        _synchronize(self.device)
        elapsed = time.perf_counter() - start
        return num_steps * self.batch_size / elapsed, waited / elapsed


def _epochs(loader, num_batches: int):
    """The loader's first `num_batches` batches, epoch after epoch."""
    done = 0
    while done < num_batches:
        for batch in loader:
            yield batch
            done += 1
            if done == num_batches:
                return


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Utilisation:
    """Mean GPU utilisation (%) while running, sampled every 50 ms; `None` without a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._read = self._reader()

    def _reader(self):
        if self.device.type != "cuda":
            return None
        index = self.device.index if self.device.index is not None else 0
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:  # noqa: BLE001  (no pynvml: nvidia-smi, or nothing)
            if shutil.which("nvidia-smi") is None:
                return None
            command = ["nvidia-smi", "-i", str(index), "--query-gpu=utilization.gpu",
                       "--format=csv,noheader,nounits"]  # fmt: skip
            return lambda: float(subprocess.run(command, capture_output=True, text=True).stdout)

    def __enter__(self):
        self._stop = threading.Event()
        if self._read is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(Exception):  # a failed sample is skipped
                self.samples.append(self._read())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._read is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


def rates(runner: Runner, rounds: int, steps: int, utilisation: Utilisation | None = None):
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        if utilisation is not None:
            with utilisation:
                runner.run(steps)
        else:
            runner.run(steps)
        out.append(steps * runner.tasks_per_step / (time.perf_counter() - start))
    return out


def measure(name: str, args, store: Path | None, device: torch.device) -> dict:
    overrides = workload_overrides(name, store, args.sinusoid_large, args.num_workers)
    common = {"check_every": args.check_every, "precision": args.precision}
    runners = {
        "batched": Runner(overrides, device, **common),
        "per-task loop": Runner(
            overrides, device, vectorize=False, num_tasks=args.loop_tasks, **common
        ),  # fmt: skip
    }
    if device.type != "cpu":
        torch.set_num_threads(args.cpu_threads)
        runners["cpu batched"] = Runner(overrides, torch.device("cpu"), precision=args.precision)
    if args.compile:
        runners["compiled"] = Runner(overrides, device, compile=True, **common)
    for runner in runners.values():
        runner.run(args.warmup)
    measured = {key: [] for key in runners}
    util = {"batched": Utilisation(device), "fed": Utilisation(device)}
    for _ in range(args.rounds):
        for key, runner in runners.items():
            measured[key] += rates(
                runner, 1, args.steps, util["batched"] if key == "batched" else None
            )
    runners["batched"].fed(args.warmup)  # starts the loader's workers (persistent)
    fed = []
    for _ in range(args.rounds):
        with util["fed"]:
            fed.append(runners["batched"].fed(args.steps))
    medians = {key: statistics.median(values) for key, values in measured.items()}
    record = {
        "workload": name,
        "batch_size": runners["batched"].batch_size,
        "tasks_per_s": measured,
        "median": medians,
        "fed_tasks_per_s": [f[0] for f in fed],
        "loader_wait_share": [f[1] for f in fed],
        "gpu_utilisation_batched": util["batched"].mean,
        "gpu_utilisation_fed": util["fed"].mean,
        "loop_tasks_per_step": runners["per-task loop"].tasks_per_step,
        "compile_messages": runners["compiled"].messages if "compiled" in runners else None,
        "compiled": runners["compiled"].step.compiled if "compiled" in runners else None,
    }
    if args.losses and name.rsplit("-", 1)[0] in ("sinusoid", "forecaster"):
        record["losses"] = precision_losses(overrides, device, args)
    return record


def precision_losses(overrides, device, args) -> dict[str, float]:
    """Mean meta-loss of the last tenth of `--losses` steps, in fp32 and in bf16 autocast."""
    out = {}
    for precision in ("fp32", "bf16"):
        runner = Runner(overrides, device, precision=precision, check_every=1, num_batches=64)
        tail = max(1, args.losses // 10)
        losses = [runner.run(1) for _ in range(args.losses)]
        out[precision] = statistics.mean(losses[-tail:])
    return out


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"CPU ({platform.processor() or platform.machine()}), torch {torch.__version__}"


def table(records: list[dict], args, device: torch.device) -> str:
    def fmt(value, digits=0):
        return "n/a" if value is None else f"{value:,.{digits}f}"

    lines = [
        f"Device: {describe(device)}; precision {args.precision}; check_every "
        f"{args.check_every or 'default'}; {args.rounds} rounds × {args.steps} steps; "
        f"load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| workload | B | batched tasks/s | per-task loop tasks/s | × loop | CPU batched "
        "tasks/s | × CPU | fed by the loader tasks/s | loader wait share | GPU util % "
        "(batched / fed) | compiled tasks/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in records:
        m = r["median"]
        cpu = m.get("cpu batched", m["batched"] if device.type == "cpu" else None)
        compiled = "not run"
        if r["compiled"] is not None:
            compiled = fmt(m["compiled"]) if r["compiled"] else "fell back to eager"
        lines.append(
            f"| {r['workload']} | {r['batch_size']} | {fmt(m['batched'])} | "
            f"{fmt(m['per-task loop'])} | {m['batched'] / m['per-task loop']:.1f}× | {fmt(cpu)} | "
            f"{m['batched'] / cpu:.1f}× | {fmt(statistics.median(r['fed_tasks_per_s']))} | "
            f"{statistics.median(r['loader_wait_share']):.0%} | "
            f"{fmt(r['gpu_utilisation_batched'])} / {fmt(r['gpu_utilisation_fed'])} | {compiled} |"
        )
    losses = [r for r in records if "losses" in r]
    if losses:
        lines += ["", "| workload | fp32 loss | bf16 loss |", "| --- | ---: | ---: |"]
        for r in losses:
            lines.append(
                f"| {r['workload']} | {r['losses']['fp32']:.4f} | {r['losses']['bf16']:.4f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument(
        "--workloads",
        nargs="+",
        type=workload_arg,
        default=["sinusoid-25", "sinusoid-4096", "forecaster-64", "anil-64", "protonet-32"],
    )
    parser.add_argument("--rounds", type=count, default=5)
    parser.add_argument("--steps", type=count, default=20, help="meta-steps per round")
    parser.add_argument("--warmup", type=count, default=3)
    parser.add_argument("--loop-tasks", type=count, default=256)
    parser.add_argument("--sinusoid-large", type=count, default=4096, help="B of sinusoid-4096")
    parser.add_argument("--cpu-threads", type=count, default=1)
    parser.add_argument(
        "--num-workers", type=non_negative, default=0, help="loader worker processes"
    )
    parser.add_argument("--check-every", type=count, default=None)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument(
        "--losses", type=non_negative, default=0, help="steps of the fp32/bf16 runs"
    )
    parser.add_argument("--entities", type=count, default=400, help="synthetic store size")
    parser.add_argument("--out", type=directory, default=Path(__file__).parent / "results" / "gpu")
    args = parser.parse_args()
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device}: not a device; cuda, cuda:N or cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but no GPU is visible; use --device cpu")
    if device.type == "cpu":
        torch.set_num_threads(args.cpu_threads)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        stored = any(not w.startswith("sinusoid") for w in args.workloads)
        store = build_store(Path(tmp), args.entities) if stored else None
        for name in args.workloads:
            records.append(measure(name, args, store, device))
            print(table(records[-1:], args, device).splitlines()[4], flush=True)
    stem = f"gpu-{device.type}"
    markdown = table(records, args, device)
    write_results(args.out / f"{stem}.md", markdown)
    settings = {k: str(v) for k, v in vars(args).items()}
    write_results(
        args.out / f"{stem}.json",
        json.dumps({"device": describe(device), "args": settings, "records": records}, indent=1),
    )
    print(markdown)


if __name__ == "__main__":
    main()
