r"""Evaluation speed: `evaluate_run` of this checkout against another one, side by side.

    git worktree add --detach /tmp/eval_before <commit>      # "today's code", once
    python benchmarks/eval.py --baseline /tmp/eval_before --rounds 3 --ets-tasks 30 \
      --json runs/eval_bench.json

(figures: BENCHMARKS.md, "Evaluation speed"). Builds once, in `--work` (default /tmp/metadist-eval-bench), a synthetic sensor panel
(`metadist synth`, 1,000 entities of 200-400 steps) ingested with its profiles as labels
(`metadist ingest --label-col label`), and trains two short runs with this checkout:

- `synthetic_protonet`, 5-way 5-shot (50 meta-steps): the few-shot case;
- `synthetic_maml` on a 50/0/50 split (50 meta-steps): the forecasting case.

Then, for `--rounds` rounds, each checkout evaluates them in a fresh process
(`PYTHONPATH=<checkout> python -c "...evaluate_run(...)"`, the working directory the
checkout), rounds interleaved so that load from other work hits both sides alike:

- `fewshot`: 1,000 class-disjoint 5-way 5-shot episodes of the meta-test profiles, with
  every baseline (from scratch, nearest centroid, 1-NN, pretrained embedding);
- `forecast`: every meta-test entity (adapt on its history, forecast its last 8 steps),
  with from scratch, naive, seasonal naive, naive 2 and Theta;
- `forecast_ets` (`--ets-tasks N`, default 50; 0 leaves it out): N of those entities
  with AutoETS too (`eval.extra_baselines=[ets]`, the `ets` extra).

`--cases` times only the cases named (and trains only their runs).

Every evaluation of this checkout runs three times in a row: "cold" (the run's `eval/`
directory removed first and an empty cache shared between runs, `$METADIST_CACHE`: what
the first evaluation of a run on a store costs), "warm" (again, as `metadist eval` after
training's own evaluation would: whatever the first left in the run directory is reused)
and "a second run's first" (a second run of the same recipe on the same store, trained
with another meta learning rate, evaluated for the first time: what the cold evaluation
left in the shared cache is reused). The baseline checkout's evaluations of the first
run stand for its second run's too (it shares nothing between runs: the same work). With `--nproc N` (N > 1) this checkout also runs a cold evaluation
sharded over N processes (`metadist eval ... --nproc-per-node N`, which writes the report;
its time is rank 0's `evaluate_run` as the report gives it, its CPU that of every
process). The baseline checkout is timed once per round, cold (its `eval/` removed first,
should it keep baselines too). With `--baseline-trains` (a baseline checkout that cannot
load this one's checkpoints: an older config format) the baseline checkout trains its own
two runs with the same recipes, seed and store, and evaluates those; the scores compared
are then the baselines' only (the meta-trained models are the two checkouts' own).
Times are the seconds `evaluate_run` took inside the child (wall, and CPU of the child and
its worker processes) and the child process's whole wall time (imports included); the
table gives medians over rounds and the ratios of medians. The methods' scores of both checkouts
are compared (largest absolute difference of any method's overall primary metric), so a
speed-up that changed a number shows. `--profile` adds one cProfile'd evaluation per case
and checkout and prints where its time went.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, non_negative, output_file, script_parser  # noqa: E402
from written import write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NUM_ENTITIES = 1000
NUM_EPISODES = 1000
# the meta-trained model's own rows (a second run's differ from the first's)
MODEL_METHODS = ("adapted", "unadapted")
# the two runs' recipes (with `_train`'s settings)
RECIPES = {
    "fewshot": ("experiment=synthetic_protonet", "sampler.options.num_shots=5"),
    "forecast": ("experiment=synthetic_maml", "data.fractions=[0.5,0,0.5]"),
}
# The evaluation of one case in a child process: prints one JSON line (the last line).
CHILD = r"""
import cProfile, io, json, pstats, resource, sys, time
wall0 = time.perf_counter()
from metadist.eval import evaluate_run
imported = time.perf_counter() - wall0
run_dir, overrides, profile = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
profiler = cProfile.Profile() if profile else None

def cpu():  # this process's and its finished children's (worker processes') CPU seconds
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime

wall, used = time.perf_counter(), cpu()
if profiler: profiler.enable()
result = evaluate_run(run_dir, overrides=overrides, write=False, progress=False)
if profiler: profiler.disable()
wall, used = time.perf_counter() - wall, cpu() - used
text = ""
if profiler:
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(30)
    text = stream.getvalue()
primary = result["primary_metric"]
print(json.dumps({
    "seconds": wall, "cpu_seconds": used, "import_seconds": imported,
    "reported_seconds": result["settings"].get("seconds"),
    "num_tasks": result["num_tasks"], "primary_metric": primary,
    "scores": {m: s[primary]["value"] for m, s in result["overall"].items()},
    "timings": result.get("timings"), "profile": text,
    "reused": result["settings"].get("reused"),
}))
"""


def _metadist(*args: str, checkout: Path = ROOT) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", *args],
        capture_output=True,
        text=True,
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
    )
    if done.returncode:
        raise SystemExit(f"metadist {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def _train(run_dir: Path, store: Path, *overrides: str, checkout: Path = ROOT) -> None:
    if (run_dir / "checkpoints").is_dir():
        return
    _metadist(
        "train",
        f"data.store={store}",
        f"run_dir={run_dir}",
        "trainer.meta_steps=50",
        "trainer.checkpoint_every=50",
        "trainer.eval_every=0",
        "trainer.num_threads=1",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        "--no-eval",
        *overrides,
        checkout=checkout,
    )


def prepare(work: Path, kinds: tuple[str, ...] = tuple(RECIPES)) -> dict[str, Path]:
    """The store and the trained runs of `kinds` (made unless already in `work`)."""
    store = work / "store"
    if not (store / "metadata.json").is_file():
        panel = work / "panel"
        _metadist(
            "synth", str(panel), "--entities", str(NUM_ENTITIES), "--length-range", "200",
            "400", "--seed", "0", "--overwrite", "--no-progress",
        )  # fmt: skip
        _metadist(
            "ingest", str(panel), str(store), "--entity-col", "entity_id", "--time-col",
            "time", "--features", "cycle_sin,cycle_cos,load,ambient,aux", "--targets", "y",
            "--stratum-col", "sensor_type", "--label-col", "label", "--scaling",
            "per-entity", "--nan", "ffill", "--no-progress",
        )  # fmt: skip
    runs = {"fewshot": work / "runs" / "protonet", "forecast": work / "runs" / "maml"}
    recipes = {case: recipe for case, recipe in RECIPES.items() if case in kinds}
    for case, recipe in recipes.items():
        _train(runs[case], store, *recipe)
    # the second run of each: the same recipe with another meta learning rate, as a
    # researcher comparing settings on one store trains it
    for case, recipe in recipes.items():
        second = work / "runs" / f"{runs[case].name}-lr3e-3"
        _train(second, store, *recipe, "optimizer.lr=0.003")
        runs[f"{case}_second"] = second
    return runs


def cases(runs: dict[str, Path], ets_tasks: int) -> dict[str, tuple[Path, list[str]]]:
    """`{case: (run_dir, eval overrides)}` (each run's second run: `runs[f"{case}_second"]`,
    the forecasting one for `forecast_ets`)."""
    # every meta-test entity anchors enough episodes that a random 1,000 can be drawn
    per_unit = math.ceil(NUM_EPISODES / (0.2 * NUM_ENTITIES * 0.5))
    out = {
        "fewshot": (
            runs["fewshot"],
            [f"eval.tasks_per_unit={per_unit}", f"eval.max_tasks={NUM_EPISODES}"],
        ),
        "forecast": (runs["forecast"], []),
    }
    if ets_tasks:
        out["forecast_ets"] = (
            runs["forecast"],
            ["eval.extra_baselines=[ets]", f"eval.max_tasks={ets_tasks}"],
        )
    return out


def evaluate(
    checkout: Path, run_dir: Path, overrides: list[str], cache: Path, profile: bool = False
):
    """One evaluation in a fresh process of `checkout`, with `cache` as the cache shared
    between runs (`$METADIST_CACHE`): the child's JSON, with the process's wall time
    added."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "METADIST_CACHE": str(cache)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir), json.dumps(overrides), "1" if profile else "0"],
        capture_output=True,
        text=True,
        cwd=checkout,
        env=env,
    )
    if done.returncode:
        raise SystemExit(f"evaluation with {checkout} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["process_seconds"] = time.perf_counter() - started
    return out


def evaluate_sharded(
    run_dir: Path, overrides: list[str], nproc: int, cache: Path
) -> dict[str, Any]:
    """A cold evaluation of this checkout sharded over `nproc` processes (the command line,
    which writes the report; `cache` as `evaluate`'s, empty): its figures as `evaluate`
    gives them."""
    shutil.rmtree(run_dir / "eval", ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "METADIST_CACHE": str(cache)}
    command = [sys.executable, "-m", "metadist.cli", "eval", f"run_dir={run_dir}"]
    command += [f"--nproc-per-node={nproc}", *overrides]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    process_seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"sharded evaluation failed:\n{done.stderr[-3000:]}")
    result = json.loads((run_dir / "eval" / "metrics.json").read_text())
    primary = result["primary_metric"]
    return {
        "seconds": result["settings"]["seconds"],
        "cpu_seconds": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "process_seconds": process_seconds,
        "num_tasks": result["num_tasks"],
        "scores": {m: s[primary]["value"] for m, s in result["overall"].items()},
        "timings": result.get("timings"),
    }


def time_recipe(work: Path, round_index: int) -> dict[str, Any]:
    """The shipped few-shot recipe's training on the benchmark's store, 5-shot, one
    thread, without its evaluation (the yardstick of "not longer than training"): the
    process's wall and CPU seconds."""
    run_dir = work / "recipe" / f"round{round_index}"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "metadist.cli", "train", "experiment=synthetic_protonet"]
    command += ["sampler.options.num_shots=5", f"data.store={work / 'store'}"]
    command += [f"run_dir={run_dir}", "trainer.num_threads=1", "logging.progress=false"]
    command += ["logging.wandb.mode=disabled", "--no-eval"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"the recipe's training failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"process_seconds": seconds, "cpu_seconds": cpu}


def _side_dir(run_dir: Path, side: str) -> Path:
    """A copy of `run_dir` for one side (its checkpoints only), so neither side sees what
    the other leaves in its run directory."""
    copy = run_dir.parent / f"{run_dir.name}-{side}"
    if not copy.is_dir():
        shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("eval"))
    return copy


def _baseline_trained(checkout: Path, run_dir: Path, case: str, work: Path) -> Path:
    """The run of `case` trained by the baseline `checkout` itself (its recipe, seed and
    settings as `prepare`'s, on the same store), for a checkout that cannot load this
    one's checkpoints (an older config format)."""
    own = run_dir.parent / f"{run_dir.name}-baseline-trained"
    _train(own, work / "store", *RECIPES[case.split("_")[0]], checkout=checkout)
    return own


def measure(args, runs: dict[str, Path]) -> dict[str, Any]:
    sides = {"baseline": args.baseline.resolve(), "current": ROOT}
    records: dict[str, Any] = {}
    for case, (run_dir, overrides) in cases(runs, args.ets_tasks).items():
        if case not in args.cases:
            continue
        dirs = {side: _side_dir(run_dir, side) for side in sides}
        if args.baseline_trains:
            dirs["baseline"] = _baseline_trained(
                sides["baseline"], run_dir, case, args.work.resolve()
            )
        dirs["second"] = _side_dir(runs[f"{case.split('_')[0]}_second"], "current")
        timed: dict[str, list[dict[str, Any]]] = {"baseline": [], "cold": [], "warm": []}
        timed["second"] = []
        if args.nproc > 1:
            timed["sharded"] = []
            dirs["sharded"] = _side_dir(run_dir, "sharded")
        for round_index in range(args.rounds):
            # the cache shared between runs: empty for a cold evaluation (the store's first)
            cache = args.work.resolve() / "shared-cache" / f"{case}-{round_index}"
            shutil.rmtree(cache, ignore_errors=True)
            order = ["baseline", "current"] if round_index % 2 == 0 else ["current", "baseline"]
            for side in order:
                # cold: a baseline that keeps its baselines too (eval/cache.py) keeps nothing
                shutil.rmtree(dirs[side] / "eval", ignore_errors=True)
                if side == "baseline":
                    # emptied too: a baseline with a shared cache (this one's, from an
                    # earlier benchmark in the same --work) would find it filled
                    unused = cache.with_name(f"{cache.name}-baseline")
                    shutil.rmtree(unused, ignore_errors=True)
                    timed["baseline"].append(evaluate(sides[side], dirs[side], overrides, unused))
                    continue
                timed["cold"].append(evaluate(sides[side], dirs[side], overrides, cache))
                timed["warm"].append(evaluate(sides[side], dirs[side], overrides, cache))
                # another run's first evaluation on the same store: the shared cache
                shutil.rmtree(dirs["second"] / "eval", ignore_errors=True)
                timed["second"].append(evaluate(sides[side], dirs["second"], overrides, cache))
                if args.nproc > 1:
                    sharded_cache = cache.with_name(f"{cache.name}-sharded")
                    sharded = evaluate_sharded(
                        dirs["sharded"], overrides, args.nproc, sharded_cache
                    )
                    timed["sharded"].append(sharded)
            if args.recipe and case == "fewshot":
                timed.setdefault("recipe", []).append(time_recipe(args.work.resolve(), round_index))
            line = ", ".join(
                f"{k} {v[-1].get('seconds', v[-1]['process_seconds']):.1f} s"
                for k, v in timed.items()
            )
            print(f"{case} round {round_index + 1}: {line}", flush=True)
        profiles = {}
        if args.profile:
            for side, checkout in sides.items():
                cache = args.work.resolve() / "shared-cache" / f"{case}-profile-{side}"
                shutil.rmtree(cache, ignore_errors=True)
                if side == "current":
                    shutil.rmtree(dirs[side] / "eval", ignore_errors=True)
                profiles[side] = evaluate(checkout, dirs[side], overrides, cache, profile=True)[
                    "profile"
                ]
                print(f"--- {case}, {side}: cProfile (cumulative)\n{profiles[side]}")
        records[case] = {
            "overrides": overrides,
            "runs": timed,
            "profiles": profiles,
            "nproc": args.nproc,
            "second_run": str(dirs["second"]),
            "baseline_run": str(dirs["baseline"]),
            "baseline_trains": args.baseline_trains,
        }
    return records


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def table(records: dict[str, Any]) -> str:
    lines = [
        "| case | tasks | checkout | evaluate_run s (median) | range | CPU s | process s "
        "| vs baseline (wall) | vs baseline (CPU) | max abs diff of scores (a second run, "
        "or a baseline that trained its own runs: of the baselines) |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for case, record in records.items():
        runs = record["runs"]
        base_wall = _median(runs["baseline"], "seconds")
        base_cpu = _median(runs["baseline"], "cpu_seconds")
        base_scores = runs["baseline"][0]["scores"]
        labels = [("baseline", "baseline"), ("cold", "this, cold"), ("warm", "this, warm")]
        labels.append(("second", "this, a second run's first"))
        if "sharded" in runs:
            labels.append(("sharded", f"this, cold, {record['nproc']} processes"))
        for side, label in labels:
            wall = [r["seconds"] for r in runs[side]]
            scores = runs[side][0]["scores"]
            # a second run's meta-trained model is another; its baselines are the same (so
            # is the baseline checkout's when it trained its own runs)
            other = side == "second" or record.get("baseline_trains")
            own = MODEL_METHODS if other else ()
            diff = max(
                (
                    abs(scores[m] - base_scores[m])
                    for m in base_scores
                    if m in scores and m not in own
                ),
                default=float("nan"),
            )
            lines.append(
                f"| {case} | {runs[side][0]['num_tasks']} | {label} | {statistics.median(wall):.1f} "
                f"| {min(wall):.1f}–{max(wall):.1f} | {_median(runs[side], 'cpu_seconds'):.1f} "
                f"| {_median(runs[side], 'process_seconds'):.1f} "
                f"| **{base_wall / statistics.median(wall):.1f}×** "
                f"| {base_cpu / _median(runs[side], 'cpu_seconds'):.1f}× | {diff:.2g} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--baseline", type=Path, required=True, help="another checkout (a git worktree)"
    )
    parser.add_argument("--work", type=directory, default=Path("/tmp/metadist-eval-bench"))
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--ets-tasks", type=non_negative, default=50)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--nproc", type=count, default=1, help="also a cold evaluation sharded over N processes"
    )
    parser.add_argument(
        "--recipe",
        action="store_true",
        help="also time the shipped synthetic_protonet recipe's training (5-shot, one "
        "thread, --no-eval) once a round, beside the few-shot evaluations",
    )
    parser.add_argument(
        "--baseline-trains",
        action="store_true",
        help="the baseline checkout trains its own runs (the same recipes, seed and store) "
        "and evaluates those: for a checkout that cannot load this one's checkpoints; the "
        "scores compared are then the baselines' only",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=("fewshot", "forecast", "forecast_ets"),
        default=["fewshot", "forecast", "forecast_ets"],
        help="which cases to time (default all; forecast_ets only with --ets-tasks > 0)",
    )
    parser.add_argument("--json", type=output_file, help="write every measurement here")
    args = parser.parse_args(argv)
    if not (args.baseline / "metadist" / "__init__.py").is_file():
        parser.error(f"--baseline {args.baseline}: not a metadist checkout")
    started = time.perf_counter()
    runs = prepare(args.work.resolve(), tuple({case.split("_")[0] for case in args.cases}))
    records = measure(args, runs)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(
        f"\n{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load {load[0]:.1f} at the end"
        if load
        else "",
    )
    print(
        f"baseline {args.baseline.resolve()} against {ROOT}; {args.rounds} rounds, "
        f"{time.perf_counter() - started:.0f} s in all\n"
    )
    print(table(records))
    recipe = records.get("fewshot", {}).get("runs", {}).get("recipe")
    if recipe:
        print(
            f"\nthe recipe's training (synthetic_protonet, 5-shot): "
            f"{_median(recipe, 'process_seconds'):.1f} s as a process, "
            f"{_median(recipe, 'cpu_seconds'):.1f} CPU s (medians of {len(recipe)})"
        )
    if args.json:
        write_results(
            args.json,
            json.dumps(
                {"baseline": str(args.baseline.resolve()), "current": str(ROOT), **records},
                indent=2,
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
