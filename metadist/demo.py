"""The main job (`make run`): synthetic panel → store → distributed meta-training → evaluation.

    metadist demo --out runs/demo        (alias: python -m metadist.demo)

1. writes the synthetic sensor panel (multi-file Parquet, rows shuffled);
2. ingests it into a series store (per-entity scaling, NaNs carried forward);
3. meta-trains the `synthetic_maml` experiment under `torchrun` with 2 CPU processes
   (`python -m metadist.launch.torchrun --standalone --nproc_per_node=2 -m metadist.train`)
   for `--meta-steps` steps or `--train-seconds` seconds, whichever comes first (at the
   time limit the run gets SIGTERM, writes a checkpoint and stops cleanly);
4. evaluates the meta-trained model on the held-out (meta-test) entities: adapt on each
   entity's history, forecast its last H steps, next to the baselines;
5. prints the metric table and where the figure and the run directory are.

Re-running with the same `--out` reuses the panel and store it finds there and resumes
the run from its latest checkpoint (a finished run is just evaluated again, always with
the demo's evaluation settings plus any `eval.KEY=VALUE` given here). Other panel
settings (`--entities`, `--length-range`, `--seed`) where `--out` holds a trained run are
refused before anything is written: the new panel would replace the run's store. A
training override the experiment does not take is refused before anything is written,
and settings the ranks would refuse on the store before torchrun starts (one line each).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from metadist.commands.parser import Parser
from metadist.datasets.synthetic import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
from metadist.durable import make_directory_beside
from metadist.eval import evaluate_run
from metadist.eval.report import EVAL_DIR, FIGURE_NAME, markdown_report
from metadist.eval.settings import load_eval_options, split_eval_overrides
from metadist.launch.children import OwnedChildren, StopRequested
from metadist.launch.local_ranks import OWNER_ENV
from metadist.store import SeriesStore
from metadist.store.ingest import ingest
from metadist.train.compose import load_config
from metadist.train.loop import finished_before
from metadist.train.preflight import check_before_launch
from metadist.train.rerun_check import check_same_settings

# Demo-size settings for a 2-core machine: at most two minutes of meta-training.
DEFAULT_ENTITIES = 600
DEFAULT_LENGTH_RANGE = (400, 1200)
DEFAULT_META_STEPS = 2000
DEFAULT_TRAIN_SECONDS = 120.0
EXPERIMENT = "synthetic_maml"
DEMO_META_BATCH = 16  # tasks a meta-step, over all processes
# Training overrides of the demo on top of the experiment file.
DEMO_OVERRIDES = (
    f"trainer.meta_batch_size={DEMO_META_BATCH}",
    "trainer.eval_every=0",
    "selection.patience=null",  # no meta-val evaluated: nothing to be patient about
    "logging.wandb.mode=disabled",
    "logging.log_every=20",
)


def build_parser(prog: str = "metadist demo") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/demo"), help="output directory (default runs/demo)"
    )
    parser.add_argument(
        "--entities",
        type=int,
        default=DEFAULT_ENTITIES,
        help=f"panel size (default {DEFAULT_ENTITIES})",
    )
    parser.add_argument(
        "--length-range",
        type=int,
        nargs=2,
        default=DEFAULT_LENGTH_RANGE,
        metavar=("A", "B"),
        help="shortest and longest series (default {} {})".format(*DEFAULT_LENGTH_RANGE),
    )
    parser.add_argument(
        "--meta-steps",
        type=int,
        default=DEFAULT_META_STEPS,
        help=f"meta-training steps (default {DEFAULT_META_STEPS}; --train-seconds may stop it first)",
    )
    parser.add_argument(
        "--train-seconds",
        type=float,
        default=DEFAULT_TRAIN_SECONDS,
        help="stop meta-training (checkpoint + clean exit) after this many seconds "
        f"(default {DEFAULT_TRAIN_SECONDS:.0f})",
    )
    parser.add_argument(
        "--nproc", type=int, default=2, help="torchrun processes (CPU ranks; default 2)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the panel and the training (default 0)"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="extra training overrides (key=value) and evaluation overrides (eval.key=value)",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "metadist demo") -> int:
    """Runs the demo; `prog` names it in messages (`python -m metadist.demo` keeps its own)."""
    args = build_parser(prog).parse_args(argv)
    if not args.train_seconds > 0:
        print(f"{prog}: error: --train-seconds must be > 0", file=sys.stderr)
        return 2
    for name in ("entities", "meta_steps", "nproc"):
        if getattr(args, name) < 1:
            print(f"{prog}: error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    started = time.perf_counter()
    out = args.out
    try:
        train_overrides, eval_overrides = split_eval_overrides(args.overrides)
        _check_not_the_demos_own(train_overrides, out)
        _check_nproc_splits_the_batch(args.nproc, train_overrides)
        load_eval_options(EXPERIMENT, eval_overrides)  # bad eval.* settings: fail now
        # bad training settings too, before the panel is written (the store does not exist
        # yet: the rest is checked against it before the ranks start, in meta_train)
        load_config(
            training_overrides("null", out / "run", args, train_overrides), world_size=args.nproc
        )
        if out.exists() and not out.is_dir():
            raise FileExistsError(f"--out {out} exists and is not a directory")
        if not out.is_dir():
            make_directory_beside(out, out)  # a file above it: one line naming --out
        store_path = prepare_store(out, args)
        run_dir = out / "run"
        code = meta_train(store_path, run_dir, args, train_overrides, prog)
        if code != 0:
            print(f"{prog}: meta-training failed (exit status {code})", file=sys.stderr)
            return code
        result = evaluate(run_dir, eval_overrides)
    except (
        ValueError,
        FileNotFoundError,
        FileExistsError,
        NotADirectoryError,
        PermissionError,
    ) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    except StopRequested as stop:
        print(f"{prog}: {stop.summary}; run it again to resume", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt:  # Ctrl-C outside meta-training (panel, store, evaluation)
        print(f"{prog}: interrupted; run it again to resume", file=sys.stderr)
        return 130
    report(result, run_dir, time.perf_counter() - started)
    return 0


# what the demo sets itself: the store and run are those under --out, the experiment its own
# (an override of them trained one thing while the demo evaluated and reported another)
_OWN_KEYS = {
    "run_dir": "the demo trains and evaluates {run_dir} (--out's run/): give another --out "
    "for a new run",
    "data.store": "the demo trains on {store}, the panel it writes: give another --out for "
    "a new one, or train on a store of your own with metadist train",
    "experiment": f"the demo runs {EXPERIMENT}: metadist train experiment=NAME runs another",
}


def _check_not_the_demos_own(overrides: list[str], out: Path) -> None:
    """Refuses a training override of what the demo sets itself (`run_dir=`, ...).

    Raises:
        ValueError: naming the override, what the demo uses instead and what to do.
    """
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in _OWN_KEYS:
            why = _OWN_KEYS[key].format(run_dir=out / "run", store=out / "data" / "store")
            raise ValueError(f"{override}: {why}")


def _check_nproc_splits_the_batch(nproc: int, overrides: list[str]) -> None:
    """Refuses `--nproc` that the demo's own meta-batch does not split over, naming the
    flag (the training's message named `trainer.meta_batch_size=16`, a setting the user
    never gave); a meta-batch the user gives is the training's to check.

    Raises:
        ValueError: naming `--nproc` and the counts that work.
    """
    size = DEMO_META_BATCH
    if size % nproc == 0 or any(o.startswith("trainer.meta_batch_size=") for o in overrides):
        return
    *fit, last = [str(n) for n in range(1, size + 1) if size % n == 0]
    fits = f"{', '.join(fit)} or {last}" if fit else last
    raise ValueError(
        f"--nproc {nproc}: the demo's meta-batch of {size} tasks does not split evenly over "
        f"{nproc} processes; use --nproc {fits}, or give trainer.meta_batch_size=M with M "
        f"a multiple of {nproc}"
    )


def prepare_store(out: Path, args: argparse.Namespace) -> Path:
    """Writes the panel and ingests it (reusing what an earlier run left); returns the store."""
    panel = out / "data" / "panel"
    store_path = out / "data" / "store"
    spec = {
        "entities": args.entities,
        "length_range": list(args.length_range),
        "seed": args.seed,
    }
    spec_path = out / "data" / "spec.json"
    earlier = json.loads(spec_path.read_text()) if spec_path.is_file() else None
    if store_path.is_dir() and earlier == spec:
        store = SeriesStore.open(store_path)
        _section(f"1-2. reusing the synthetic panel and store in {out / 'data'}")
        _print_store(store)
        return store_path
    if store_path.is_dir() and (out / "run" / "checkpoints" / "latest").is_file():
        # a new panel would replace the store that run was trained on, and the run would
        # then refuse the new one: nothing gained, and its store lost
        raise ValueError(
            f"{out / 'run'} holds a run trained on the store of "
            f"{_panel_flags(earlier) if earlier else 'an earlier panel'}; "
            f"{_panel_flags(spec)} would replace that store: give another --out (or remove "
            f"{out / 'run'} to start over)"
        )
    _section("1. synthetic sensor panel")
    summary = write_synthetic_panel(
        panel,
        num_entities=args.entities,
        length_range=tuple(args.length_range),
        seed=args.seed,
        overwrite=True,
        progress=False,
    )
    print(summary)
    _section("2. ingest into a series store")
    t0 = time.perf_counter()
    store = ingest(
        panel,
        store_path,
        progress=False,
        **SYNTHETIC_INGEST_ARGS,
    )
    print(f"ingested in {time.perf_counter() - t0:.1f} s")
    _print_store(store)
    spec_path.write_text(json.dumps(spec))
    return store_path


def _panel_flags(spec: dict) -> str:
    """`--entities N --length-range A B --seed S` of a panel's `spec.json`."""
    low, high = spec["length_range"]
    return f"--entities {spec['entities']} --length-range {low} {high} --seed {spec['seed']}"


def _print_store(store) -> None:
    strata = ", ".join(
        f"{name} {int((store.stratum_codes == i).sum())}"
        for i, name in enumerate(store.stratum_names)
    )
    print(
        f"store {store.path}: {store.num_entities} entities ({strata}), {store.num_rows} rows, "
        f"columns {', '.join(store.column_names)} (target {', '.join(store.target_names)}), "
        f"scaling {store.scaler.kind}"
    )


def training_overrides(
    store: Path | str, run_dir: Path, args: argparse.Namespace, overrides: list[str]
) -> list[str]:
    """The overrides the demo trains with: its own settings, then the user's."""
    return [
        f"experiment={EXPERIMENT}",
        f"data.store={store}",
        f"run_dir={run_dir}",
        f"trainer.meta_steps={args.meta_steps}",
        f"trainer.seed={args.seed}",
        f"trainer.checkpoint_every={max(1, min(250, args.meta_steps // 2))}",
        *DEMO_OVERRIDES,
        *overrides,
    ]


def meta_train(
    store: Path,
    run_dir: Path,
    args: argparse.Namespace,
    overrides: list[str],
    prog: str = "metadist demo",
) -> int:
    """Runs `synthetic_maml` under torchrun with `args.nproc` CPU ranks; returns its status.
    The ranks speak as `prog`, and leave a stop for `prog` to report (as the ranks of
    `metadist train --nproc-per-node` do).

    Raises:
        ValueError: `run_dir` holds a run of other settings (naming another --out), or the
            ranks would refuse the settings or the store (as `metadist train
            --nproc-per-node` checks them, before any process starts).
    """
    train_overrides = training_overrides(store, run_dir, args, overrides)
    command = [
        sys.executable,
        "-m",
        "metadist.launch.torchrun",
        "--standalone",
        f"--nproc_per_node={args.nproc}",
        "-m",
        "metadist.train",
        "--no-eval",  # step 4 evaluates, with the demo's evaluation overrides
        *train_overrides,
    ]
    _section(f"3. meta-training {EXPERIMENT} on {cpu_processes(args.nproc)} (torchrun)")
    print("$ " + shlex.join(["python", *command[1:]]))
    # a Ctrl-C while a rank imports torch: no traceback from it (launch/rank_entry.py)
    module_at = command.index("metadist.train")
    command[module_at:module_at] = ["metadist.launch.rank_entry"]
    if finished_before(train_overrides, run_dir):
        print(
            f"meta-training: {run_dir} already holds all {args.meta_steps} meta-steps of this "
            "run (same settings and store): confirmed, not trained again"
        )
        return 0
    # the training's own refusal would suggest run_dir=, which the demo does not take
    check_same_settings(train_overrides, run_dir, f"another --out (the demo trains in {run_dir})")
    # one line now rather than that line from a rank, torchrun's report and the demo's
    check_before_launch(load_config(train_overrides, world_size=args.nproc), args.nproc)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("WANDB_MODE", "disabled")
    env[OWNER_ENV] = prog  # one line on a stop, the demo's; a rank's error names the demo
    t0 = time.perf_counter()
    with OwnedChildren("metadist demo", grace_s=180) as children:
        process = children.popen(command, env=env)
        try:
            code = process.wait(timeout=args.train_seconds)
        except subprocess.TimeoutExpired:
            # torchrun forwards SIGTERM to the ranks, which finish the step, checkpoint and exit.
            print(f"time limit of {args.train_seconds:.0f} s reached: stopping meta-training")
            children.stop_all(signal.SIGTERM)
            code = 0 if (run_dir / "checkpoints" / "latest").is_file() else 1
    if code == 0:  # a failure is reported by the caller, without a time
        print(f"meta-training took {time.perf_counter() - t0:.1f} s")
    return code


def evaluate(run_dir: Path, overrides: list[str]) -> dict:
    """A fresh evaluation of the run's latest checkpoint with the demo's settings.

    Always re-scored (a few seconds at demo size): a report left by an earlier
    `metadist eval` with other settings is replaced, never shown as this run's.
    """
    _section("4. evaluation on held-out entities")
    return evaluate_run(run_dir, overrides=overrides)


def report(result: dict, run_dir: Path, seconds: float) -> None:
    """Prints the table, whether adaptation paid off, and where the outputs are."""
    print()
    print(markdown_report(result), end="")
    print()
    overall = result["overall"]
    metric = result["primary_metric"]
    label = result.get("primary_metric_label", metric)

    def value(method: str) -> float:
        return float(overall[method][metric]["value"])

    adapted = value("adapted")
    for other in ("unadapted", "naive", "theta"):
        if other in overall:
            verdict = "beats" if adapted < value(other) else "does NOT beat"
            print(
                f"adapted {label} {adapted:.3f} {verdict} {result['methods'][other]} "
                f"{value(other):.3f}"
            )
    figure = run_dir / EVAL_DIR / FIGURE_NAME
    print(f"figure:        {_shown(figure)}")
    print(f"tables:        {_shown(run_dir / EVAL_DIR)}/metrics.md, metrics.json")
    print(f"run directory: {_shown(run_dir)} (checkpoints, config, metrics.jsonl)")
    print(f"total time:    {seconds:.0f} s")


def _shown(path: Path) -> Path:
    """`path` relative to the working directory when it lies inside it, else absolute."""
    path = path.resolve()
    try:
        return path.relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def _section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def cpu_processes(count: int) -> str:
    """`1 CPU process`, `2 CPU processes`."""
    return f"{count} CPU process" + ("" if count == 1 else "es")


if __name__ == "__main__":
    sys.exit(main(prog="python -m metadist.demo"))
