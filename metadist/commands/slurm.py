"""`metadist slurm submit`: write a training job's sbatch script and submit it.

The jobs themselves (the script, the checkpoint-and-requeue protocol, the check of the
training config) are `metadist.launch.slurm`.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import replace
from pathlib import Path

from metadist.commands.train import checked_eval_options, refuse_eval_overrides
from metadist.launch.slurm import (
    LAUNCH_KEYS,
    check_python,
    check_training_config,
    find_sbatch,
    job_from_settings,
    submit_script,
    write_script,
)
from metadist.train.rerun_check import check_same_settings

DESCRIPTION = "Slurm jobs that run `torchrun` on every node and survive preemption by requeueing."


def _cmd_submit(args: argparse.Namespace) -> int:
    job, run_dir = job_from_settings(args.settings, sbatch_args=args.sbatch_arg)
    overrides = list(job.train_args)
    check_python(job)
    if args.no_eval:  # refused now, as the job's training would refuse it on the nodes
        refuse_eval_overrides(overrides)
    config_dir = None if args.config_dir is None else str(Path(args.config_dir).resolve())
    config = check_training_config(job, config_dir)
    if not args.no_eval:  # the job's training evaluates at its end: bad settings fail now
        checked_eval_options(config)
    # A run_dir that holds a run of other settings: the job's training would refuse to
    # resume it once the job starts, after its wait in the queue.
    check_same_settings(overrides, run_dir, None, config_dir)
    if config_dir is not None:  # the job's ranks read the same experiments
        job = replace(job, train_args=(*job.train_args, "--config-dir", config_dir))
    if args.no_eval:
        job = replace(job, train_args=(*job.train_args, "--no-eval"))
    if args.dry_run:
        print(job.render(), end="")
        return 0
    find_sbatch()
    # Logs go to <run_dir>/slurm/; Slurm does not create the directory of --output.
    logs = run_dir / "slurm"
    # what a refusal removes: every directory made for it (runs/slurm/ of a default run_dir)
    made = [d for d in (*reversed(logs.parents), logs) if not d.exists()]
    logs.mkdir(parents=True, exist_ok=True)
    script = write_script(job, logs / "job.sbatch")
    try:
        job_id = submit_script(script)
    except (ValueError, OSError) as error:
        script.unlink(missing_ok=True)  # nothing was submitted: nothing is left behind
        for directory in reversed(made):
            shutil.rmtree(directory, ignore_errors=True)
        raise ValueError(
            f"{error}; nothing was submitted, and nothing is left in {run_dir}"
        ) from None
    print(f"submitted job {job_id}: run directory {run_dir}, log {run_dir}/slurm/{job_id}.out")
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist slurm submit`."""
    parser = subparsers.add_parser(
        "slurm",
        help="run training as a Slurm job (torchrun on every node, checkpoint + requeue)",
        description=DESCRIPTION,
    )
    commands = parser.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND", required=True)
    submit = commands.add_parser(
        "submit",
        help="write and submit an sbatch script",
        description=(
            "Write and submit an sbatch script. Launch settings: "
            + ", ".join(f"{key}=" for key in LAUNCH_KEYS)
            + "; every other KEY=VALUE (experiment=NAME is required) is passed to the "
            "training as a Hydra override."
        ),
    )
    submit.add_argument(
        "settings",
        nargs="*",
        metavar="KEY=VALUE",
        help="launch settings and training overrides (above); experiment=NAME is required",
    )
    submit.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    submit.add_argument(
        "--config-dir",
        default=None,
        metavar="DIR",
        help="the experiments directory (e.g. one made by `metadist experiments copy`), "
        "checked now and passed to the job's training",
    )
    submit.add_argument(
        "--no-eval",
        action="store_true",
        help="the job's training skips the held-out evaluation that ends it (metadist "
        "train --no-eval)",
    )
    submit.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="an extra #SBATCH option, verbatim (repeatable), e.g. --sbatch-arg=--exclusive",
    )
    submit.set_defaults(func=_cmd_submit)
