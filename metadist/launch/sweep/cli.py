"""`metadist sweep`: the command line of sweeps."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metadist.launch.sweep.driver import run_sweep
from metadist.launch.sweep.rerun import rerun_trial
from metadist.launch.sweep.settings import BEST_FILE, TABLE_FILE, SweepSettings
from metadist.launch.sweep.space import load_search_space


def _settings_from_args(args: argparse.Namespace) -> SweepSettings:
    overrides = list(args.overrides)
    experiment = next((t.partition("=")[2] for t in overrides if t.startswith("experiment=")), "")
    if not experiment:
        raise ValueError("experiment=NAME is required")
    sweep_dir = Path(args.sweep_dir) if args.sweep_dir else Path("runs", "sweeps", experiment)
    if not args.space:
        raise ValueError("--space FILE is required (the search space, YAML)")
    space = load_search_space(args.space)
    return SweepSettings(
        overrides=overrides,
        space=space,
        sweep_dir=sweep_dir,
        num_trials=args.trials,
        metric=args.metric,
        direction=args.direction,
        base_seed=args.seed,
        test_seed=args.test_seed,
        launcher=args.launcher,
        nproc_per_node=args.nproc_per_node,
        parallel=args.parallel,
        pruner=args.pruner,
        startup_trials=args.startup_trials,
        warmup_steps=args.warmup_steps,
        sampler_seed=args.sampler_seed,
        poll_seconds=args.poll_seconds,
        max_failures=args.max_failures,
        config_dir=args.config_dir,
        slurm_settings=list(args.slurm),
    )


def _cmd_sweep(args: argparse.Namespace) -> int:
    if args.rerun is not None:
        if not args.sweep_dir:
            raise ValueError("--rerun needs --sweep-dir (the sweep holding the trial)")
        recorded, rerun = rerun_trial(args.sweep_dir, args.rerun, args.poll_seconds)
        if recorded != rerun:
            print(
                f"trial {args.rerun} did not reproduce: {recorded!r} != {rerun!r}", file=sys.stderr
            )
            return 1
        print(f"trial {args.rerun} reproduced exactly")
        return 0
    settings = _settings_from_args(args)
    study = run_sweep(settings)
    print(f"trials: {settings.sweep_dir / TABLE_FILE}")
    if (settings.sweep_dir / BEST_FILE).exists():
        best = study.best_trial
        print(
            f"best: trial {best.number}, {settings.metric}={best.value:.6g} "
            f"({settings.sweep_dir / BEST_FILE})"
        )
    return 0


_DESCRIPTION = "Hyper-parameter sweeps: an Optuna study whose trials are separate training runs."


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist sweep`."""
    parser = subparsers.add_parser(
        "sweep",
        help="hyper-parameter sweep: an Optuna study whose trials are training runs",
        description=_DESCRIPTION,
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="overrides of every trial; experiment=NAME is required",
    )
    parser.add_argument("--trials", type=int, default=10, help="trials to finish (default 10)")
    parser.add_argument("--space", help="search space YAML (required unless --rerun)")
    parser.add_argument("--sweep-dir", help="default runs/sweeps/<experiment>")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local")
    parser.add_argument("--metric", default="loss", help="meta-val metric (default loss)")
    parser.add_argument("--direction", choices=("minimize", "maximize"), default="minimize")
    parser.add_argument("--seed", type=int, default=0, help="trial k gets trainer.seed=SEED+k")
    parser.add_argument(
        "--test-seed", type=int, default=0, help="seed of the meta-test split pinned in every trial"
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        help="training processes per local trial (torchrun when > 1)",
    )
    parser.add_argument("--parallel", type=int, default=1, help="trials running at once")
    parser.add_argument("--pruner", choices=("median", "none"), default="median")
    parser.add_argument(
        "--startup-trials", type=int, default=2, help="finished trials before pruning starts"
    )
    parser.add_argument(
        "--warmup-steps", type=int, default=0, help="steps of a trial before it may be pruned"
    )
    parser.add_argument("--sampler-seed", type=int, default=0, help="seed of the TPE sampler")
    parser.add_argument("--poll-seconds", type=float, default=1.0)
    parser.add_argument("--max-failures", type=int, default=3)
    parser.add_argument("--config-dir", help="experiments directory (passed to the training)")
    parser.add_argument(
        "--slurm",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Slurm launch setting (repeatable), as in metadist slurm submit",
    )
    parser.add_argument(
        "--rerun",
        type=int,
        metavar="TRIAL",
        help="run a completed trial of --sweep-dir again and check its metric reproduces",
    )
    parser.set_defaults(func=_cmd_sweep)
