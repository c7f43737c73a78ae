"""`metadist sweep`: the command line of sweeps (`metadist.launch.sweep`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from metadist.launch.children import StopRequested
from metadist.launch.sweep import (
    BEST_FILE,
    TABLE_FILE,
    SweepSettings,
    load_search_space,
    rerun_trial,
    run_sweep,
)


def _settings_from_args(args: argparse.Namespace) -> SweepSettings:
    overrides = list(args.overrides)
    experiment = next((t.partition("=")[2] for t in overrides if t.startswith("experiment=")), "")
    if not experiment:
        raise ValueError("experiment=NAME is required")
    sweep_dir = Path(args.sweep_dir) if args.sweep_dir else Path("runs", "sweeps", experiment)
    if not args.space:
        raise ValueError("--space FILE is required (the search space, YAML)")
    space = load_search_space(args.space)
    # Only the flags given reach the settings: the defaults are SweepSettings' own.
    given = {
        field: getattr(args, dest) for dest, field in _FLAG_FIELDS.items() if hasattr(args, dest)
    }
    return SweepSettings(
        overrides=overrides,
        space=space,
        sweep_dir=sweep_dir,
        config_dir=args.config_dir,
        slurm_settings=list(args.slurm),
        **given,
    )


def _cmd_sweep(args: argparse.Namespace) -> int:
    if args.rerun is not None:
        if not args.sweep_dir:
            raise ValueError("--rerun needs --sweep-dir (the sweep holding the trial)")
        flags = [d for d in _FLAG_FIELDS if hasattr(args, d) and d != "poll_seconds"]
        extra = [
            *args.overrides,
            *(["--space"] if args.space else []),
            *(f"--{d.replace('_', '-')}" for d in flags),
            *(["--slurm"] if args.slurm else []),
            *(["--config-dir"] if args.config_dir else []),
        ]
        if extra:  # a rerun takes the trial's settings from the study, nothing else
            raise ValueError(
                f"--rerun runs trial {args.rerun} with the settings its study recorded; "
                f"leave out {extra[0]}"
            )
        poll = getattr(args, "poll_seconds", SweepSettings.poll_seconds)
        try:
            recorded, rerun = rerun_trial(args.sweep_dir, args.rerun, poll)
        except StopRequested as stop:  # SIGTERM or SIGHUP; the rerun's training stopped
            print(
                f"metadist sweep: {stop.summary} (the rerun of trial {args.rerun})", file=sys.stderr
            )
            return stop.exit_status
        if recorded != rerun:
            print(
                f"trial {args.rerun} did not reproduce: {recorded!r} != {rerun!r}", file=sys.stderr
            )
            return 1
        print(f"trial {args.rerun} reproduced exactly")
        return 0
    settings = _settings_from_args(args)
    try:
        study = run_sweep(settings)
    except StopRequested as stop:  # SIGTERM or SIGHUP; its running trials were queued again
        print(
            f"metadist sweep: {stop.summary} (run the same command again to continue the sweep)",
            file=sys.stderr,
        )
        return stop.exit_status
    print(f"trials: {settings.sweep_dir / TABLE_FILE}")
    if (settings.sweep_dir / BEST_FILE).exists():
        best = study.best_trial
        print(
            f"best: trial {best.number}, {settings.metric}={best.value:.6g} "
            f"({settings.sweep_dir / BEST_FILE})"
        )
    return 0


_DESCRIPTION = "Hyper-parameter sweeps: an Optuna study whose trials are separate training runs."


# argparse dest -> SweepSettings field, for the flags that set one.
_FLAG_FIELDS: dict[str, str] = {}


def _settings_adder(parser: argparse.ArgumentParser):
    """`setting(flag, field, type, help, **kw)`: adds a flag whose default (shown in the
    help) is the `SweepSettings` field's, so the defaults live in one place."""
    defaults = {f.name: f.default for f in dataclasses.fields(SweepSettings)}

    def setting(flag: str, field: str, kind: type, text: str, **extra) -> None:
        dest = flag.lstrip("-").replace("-", "_")
        _FLAG_FIELDS[dest] = field
        shown = f"default {defaults[field]}"
        parser.add_argument(
            flag,
            type=kind,
            default=argparse.SUPPRESS,
            help=f"{text} ({shown})" if text else shown,
            **extra,
        )

    return setting


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
    setting = _settings_adder(parser)
    setting("--trials", "num_trials", int, "trials to finish")
    parser.add_argument("--space", help="search space YAML (required unless --rerun)")
    parser.add_argument("--sweep-dir", help="default runs/sweeps/<experiment>")
    setting("--launcher", "launcher", str, "where trials run", choices=("local", "slurm"))
    setting("--metric", "metric", str, "meta-val metric to optimise")
    setting("--direction", "direction", str, "", choices=("minimize", "maximize"))
    setting("--seed", "base_seed", int, "trial k gets trainer.seed=SEED+k")
    setting("--test-seed", "test_seed", int, "seed of the meta-test split pinned in every trial")
    setting(
        "--nproc-per-node",
        "nproc_per_node",
        int,
        "training processes per local trial (torchrun when > 1)",
    )
    setting("--parallel", "parallel", int, "trials running at once")
    setting("--pruner", "pruner", str, "", choices=("median", "none"))
    setting("--startup-trials", "startup_trials", int, "finished trials before pruning starts")
    setting("--warmup-steps", "warmup_steps", int, "steps of a trial before it may be pruned")
    setting("--sampler-seed", "sampler_seed", int, "seed of the TPE sampler")
    setting("--poll-seconds", "poll_seconds", float, "how often a running trial is read")
    setting("--max-failures", "max_failures", int, "stop after this many failed trials")
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
