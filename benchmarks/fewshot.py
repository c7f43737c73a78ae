"""Few-shot classification benchmark on real UCR/UEA sets, class-disjoint meta-splits.

    python benchmarks/fewshot.py [--sets ACSF1 OSULeaf ...] [--shots 1 5]
                                 [--learners protonet maml] [--out runs/fewshot]
                                 [--jobs 2] [TRAINING OVERRIDES ...]

For every set (read from the `.ts` files of the installed sktime or aeon wheel: the `ucr`
extra; nothing is downloaded), every shot count and every learner:

1. `metadist datasets ucr NAME OUT/data/NAME` and `metadist ingest` with the arguments it
   prints (one entity per case, its class as label, each case z-normalised);
2. N = min(5, the classes of the smaller meta-split that have K + Q cases): meta-train and
   meta-test hold disjoint halves of the classes (`data.split_by=label`, which the
   recipes' `auto` gives wherever each split has 2 classes; `data.fractions=[0.5, 0, 0.5]`);
3. `metadist train experiment=ucr_<learner> ...` (training, then evaluation on the
   meta-test classes with the nearest-centroid, 1-NN, from-scratch, pretrained-embedding
   and Baseline++ baselines on the same episodes; the pretrained embedding gets the
   meta-learner's budget: eval.pretrain_steps steps of meta_batch_size × N × (K + Q)
   labelled examples, and where the learner pre-trained with those settings
   (`metabaseline` and its `_ft`, `_adam`, `_tune` variants) it is that pre-training
   continued, so the two share their first pretrain.steps steps);
4. one table of accuracies ± 95% intervals (over episodes) in OUT/fewshot.md, with the
   meta-learned accuracy minus the pretrained embedding's paired over the same episodes.

`--seeds S1 S2 ...` repeats the benchmark once per seed. The seed (`trainer.seed`) draws
the class split, the meta-test episodes and the network's initialisation, so each seed is
its own split of the classes as well as its own training: a row per seed (the run directory
ends `_seedS`; the learners of one seed share its split and episodes), then per learner a
line of its accuracy over the seeds and its difference from the pretrained embedding, each
seed paired with its own (mean ± 95% interval over all the seeds' episodes).

`--learners` names the recipes `ucr_<learner>`: `protonet`, `maml`, `maml_plus` (MAML with
the shared head and the MAML++ options), `maml_pretrained` (MAML from a pretrained
backbone, Proto-MAML's head, 10 first-order steps at 0.01), `maml_tune` (the same
training, its evaluation fitting each support set with 100 Adam inner steps: at 0.003,
at 0.01 in 1-shot episodes),
`metabaseline` (pre-training, then meta-training),
`metabaseline_ft` (the same, its cosine head fine-tuned on each support set by SGD steps of
meta-learned sizes), `metabaseline_adam` (the same with Adam's update, 100 steps),
`metabaseline_tune` (`metabaseline_adam`, its evaluation tuning the whole embedding network
with the head).

Nothing here is specific to a set: any installed classification set with at least four
classes works. Settings are the shipped experiment files'; none was tuned on a test split.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow.parquet as pq

from metadist.datasets.ucr import available_ucr_sets
from metadist.launch.children import OwnedChildren, StopRequested

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arguments import count, directory, script_parser  # noqa: E402
from written import write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "experiments" / "experiment"
DEFAULT_SETS = ("ACSF1", "OSULeaf")
METHOD_ORDER = (
    "adapted",
    "unadapted",
    "scratch",
    "nearest_centroid",
    "one_nn",
    "pretrained",
    "baseline_pp",
)
COLUMN_NAMES = {
    "adapted": "meta-learned",
    "unadapted": "no adaptation",
    "scratch": "from scratch",
    "nearest_centroid": "nearest centroid",
    "one_nn": "1-NN",
    "pretrained": "pretrained emb.",
    "baseline_pp": "Baseline++",
}
NUM_QUERY = 5  # the recipe's sampler.options.num_query
META_BATCH_SIZE = 8  # the recipes' trainer.meta_batch_size


class Plan(NamedTuple):
    """One training and evaluation of the benchmark."""

    name: str
    shots: int
    ways: int
    train_classes: int
    test_classes: int
    learner: str
    store: Path
    run_dir: Path
    seed: int


def _metadist(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", *args], capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode:
        raise SystemExit(_last_line(done.stderr) or f"metadist {' '.join(args)} failed")
    return done.stdout


def _last_line(text: str) -> str:
    """The last line of a command's stderr: where the project's commands say what failed."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _available(name: str, out: Path) -> bool:
    """Whether set `name` has a store under `out` already, or is installed to prepare."""
    return (out / "data" / name / "store" / "metadata.json").is_file() or (
        name in available_ucr_sets()
    )


def prepare(name: str, out: Path) -> Path:
    """The store of set `name` (written and ingested unless already there)."""
    directory = out / "data" / name
    store = directory / "store"
    if (store / "metadata.json").is_file():
        return store
    summary = _metadist("datasets", "ucr", name, str(directory), "--overwrite")
    # the ingest command the summary prints on its `next:` line (a `then:` hint follows it)
    lines = [line for line in summary.splitlines() if line.startswith("next: metadist ")]
    if not lines:
        raise SystemExit(
            f"metadist datasets ucr {name}: no 'next: metadist ingest' line in\n{summary}"
        )
    command = lines[0].removeprefix("next: metadist ").split()
    command[2] = str(store)
    _metadist(*command, "--no-progress")
    return store


def num_ways(store: Path, shots: int, num_query: int, seed: int) -> tuple[int, int, int]:
    """(N, usable meta-train classes, usable meta-test classes) of the class split."""
    from metadist.data import build_partitioner
    from metadist.store import SeriesStore
    from metadist.tasks import build_task_sampler

    series = SeriesStore.open(store)
    sampler = build_task_sampler(
        "nway_kshot", series, num_ways=2, num_shots=1, num_query=1, lookback=None, resample_to=8
    )
    part = build_partitioner(
        sampler, series, seed=seed, fractions=(0.5, 0.0, 0.5), split_by="label"
    )
    usable = []
    for split in ("train", "test"):
        counts = np.bincount(sampler.unit_classes()[part.units(split)])
        usable.append(int((counts >= shots + num_query).sum()))
    return min(5, *usable), usable[0], usable[1]


def run_one(
    children: OwnedChildren,
    store: Path,
    learner: str,
    shots: int,
    ways: int,
    run_dir: Path,
    extra: list[str],
):
    if (run_dir / "eval" / "metrics.json").is_file():
        return json.loads((run_dir / "eval" / "metrics.json").read_text()), 0.0
    command = [
        sys.executable,
        "-m",
        "metadist.train",
        f"experiment=ucr_{learner}",
        f"data.store={store}",
        f"run_dir={run_dir}",
        # class-disjoint whatever the set (the recipes' `auto` is too, where N fits)
        "data.split_by=label",
        f"sampler.options.num_ways={ways}",
        f"sampler.options.num_shots={shots}",
        # the pretrained embedding reads as many labelled examples per step as a
        # meta-batch holds (and as many steps: the recipe's eval.pretrain_steps)
        f"eval.pretrain_batch_size={_meta_batch_size(extra) * ways * (shots + NUM_QUERY)}",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        "trainer.num_threads=1",
        *extra,
    ]
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = children.popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    _, stderr = process.communicate()
    children.forget(process)
    if process.returncode:
        why = _last_line(stderr) or f"exit status {process.returncode}"
        raise SystemExit(f"benchmarks/fewshot.py: the training of {run_dir} failed: {why}")
    seconds = time.perf_counter() - started
    return json.loads((run_dir / "eval" / "metrics.json").read_text()), seconds


def paired_difference(run_dir: Path, other: str = "pretrained") -> str:
    """The meta-learned accuracy minus `other`'s, paired over the same episodes: mean ±
    95% interval of the per-episode differences (from the evaluation's tasks.parquet)."""
    accuracy = per_episode(run_dir)
    if "adapted" not in accuracy or other not in accuracy:
        return "—"
    return _mean_interval(accuracy["adapted"] - accuracy[other])


def seed_mean(run_dirs: list[Path], other: str = "pretrained") -> str:
    """A learner's runs over several seeds (each its own split and episodes): each run's
    meta-learned accuracy and their mean, then the difference from `other`'s accuracy,
    each run paired with its own, as mean ± 95% interval over all the runs' episodes."""
    runs = [per_episode(run) for run in run_dirs]
    accuracies = [run["adapted"].mean() for run in runs]
    text = (
        f"mean {np.mean(accuracies):.3f} over {len(run_dirs)} seeds "
        f"({', '.join(f'{v:.3f}' for v in accuracies)})"
    )
    if all(other in run for run in runs):
        pooled = np.concatenate([run["adapted"] - run[other] for run in runs])
        text += f"; − {other}, each seed paired: {_mean_interval(pooled)}"
    return text


def per_episode(run_dir: Path) -> dict[str, np.ndarray]:
    """Each method's accuracy per meta-test episode, from the evaluation's tasks.parquet
    (empty where the run has none)."""
    path = run_dir / "eval" / "tasks.parquet"
    if not path.is_file():
        return {}
    table = pq.read_table(path)
    points = table.column("num_points").to_numpy()
    return {
        name.removesuffix(":accuracy"): table.column(name).to_numpy() / points
        for name in table.column_names
        if name.endswith(":accuracy")
    }


def _mean_interval(values: np.ndarray) -> str:
    """`mean ± half-width of the 95 % interval` of `values`."""
    interval = 1.96 * values.std(ddof=1) / np.sqrt(len(values))
    return f"{values.mean():+.3f} ± {interval:.3f}"


def _meta_batch_size(overrides: list[str]) -> int:
    """trainer.meta_batch_size as the overrides leave it."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("trainer.meta_batch_size=")]
    return int(given[-1]) if given else META_BATCH_SIZE


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--sets", nargs="+", default=list(DEFAULT_SETS))
    parser.add_argument("--shots", nargs="+", type=count, default=[1, 5])
    parser.add_argument("--learners", nargs="+", default=["protonet", "maml"])
    parser.add_argument("--out", type=directory, default=Path("runs/fewshot"))
    parser.add_argument("--jobs", type=count, default=1)
    parser.add_argument(
        "--seed", type=int, default=0, help="the class split's, episodes' and training's seed"
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=None,
        help="several seeds, one benchmark each (its own split, episodes and training)",
    )
    parser.add_argument(
        "overrides", nargs="*", help="training overrides, e.g. trainer.meta_steps=300"
    )
    args = parser.parse_args(argv)
    out = args.out.resolve()
    seeds = args.seeds if args.seeds is not None else [args.seed]
    if len(set(seeds)) != len(seeds):
        parser.error("--seeds: each seed once")
    recipes = sorted(p.stem.removeprefix("ucr_") for p in RECIPES.glob("ucr_*.yaml"))
    unknown = [learner for learner in args.learners if learner not in recipes]
    if unknown:
        parser.error(f"--learners {' '.join(unknown)}: no such recipe; one of {', '.join(recipes)}")
    missing = [name for name in args.sets if not _available(name, out)]
    if missing:
        parser.error(
            f"--sets {' '.join(missing)}: not an installed UCR/UEA set (names are "
            f"case-sensitive); installed: {', '.join(available_ucr_sets()) or 'none'}"
        )
    started = time.perf_counter()
    plans = []
    for name in args.sets:
        store = prepare(name, out)
        for shots in args.shots:
            for seed in seeds:
                ways, train_classes, test_classes = num_ways(store, shots, NUM_QUERY, seed)
                if ways < 2:
                    print(f"{name}, {shots}-shot: fewer than 2 usable classes per split; skipped")
                    continue
                for learner in args.learners:
                    run_dir = out / "runs" / f"{name}_{learner}_{ways}way_{shots}shot"
                    if args.seeds is not None:
                        run_dir = run_dir.with_name(f"{run_dir.name}_seed{seed}")
                    plans.append(
                        Plan(name, shots, ways, train_classes, test_classes, learner, store,
                             run_dir, seed)
                    )  # fmt: skip

    finished = iter(range(1, len(plans) + 1))  # next() is atomic: the jobs' threads share it

    def work(plan: Plan):
        extra = [f"trainer.seed={plan.seed}", *args.overrides]
        result = run_one(
            children, plan.store, plan.learner, plan.shots, plan.ways, plan.run_dir, extra
        )
        # each run trains and evaluates for minutes: say which finished, as they do
        how = f"{result[1]:.0f} s" if result[1] else "read back"
        print(f"# {next(finished)}/{len(plans)}: {plan.run_dir.name} ({how})", flush=True)
        return result

    pool = ThreadPoolExecutor(max_workers=args.jobs)
    children = OwnedChildren("benchmarks/fewshot.py")
    try:
        with children:  # a stop signal reaches every training, then one line says so
            results = list(pool.map(work, plans))
    except StopRequested as stop:
        pool.shutdown(wait=True, cancel_futures=True)
        print(f"benchmarks/fewshot.py: {stop.summary}", file=sys.stderr)
        return stop.exit_status
    pool.shutdown()
    lines = [
        "| set | classes (train / test) | task | learner | "
        + " | ".join(COLUMN_NAMES[m] for m in METHOD_ORDER)
        + " | − pretrained (paired) | episodes | train + eval s |",
        "| --- | --- | --- | --- | "
        + " | ".join("---:" for _ in METHOD_ORDER)
        + " | ---: | ---: | ---: |",
    ]
    for plan, (metrics, seconds) in zip(plans, results, strict=True):
        name, shots, ways, train_classes, test_classes, learner, _, run_dir, seed = plan
        if args.seeds is not None:
            learner = f"{learner} (seed {seed})"
        cells = []
        for method in METHOD_ORDER:
            score = metrics["overall"].get(method, {}).get("accuracy")
            cells.append("—" if score is None else f"{score['value']:.3f} ± {score['ci95']:.3f}")
        lines.append(
            f"| {name} | {train_classes} / {test_classes} | {ways}-way {shots}-shot | {learner} | "
            + " | ".join(cells)
            + f" | {paired_difference(run_dir)} | {metrics['num_tasks']} | {seconds:.0f} |"
        )
    if len(seeds) > 1:
        lines.append("")
        for key in dict.fromkeys((plan.name, plan.shots, plan.learner) for plan in plans):
            runs = [p.run_dir for p in plans if (p.name, p.shots, p.learner) == key]
            name, shots, learner = key
            lines.append(f"- {name} {shots}-shot {learner}: {seed_mean(runs)}")
    table = "\n".join(lines)
    write_results(out / "fewshot.md", table + "\n")
    print(table)
    print(
        f"\n# {len(plans)} runs in {time.perf_counter() - started:.0f} s; "
        f"table: {out / 'fewshot.md'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
