"""`metadist slurm submit`: write a training job's sbatch script and submit it.

The jobs themselves (the script, the checkpoint-and-requeue protocol, the check of the
training config) are `metadist.launch.slurm`.
"""

from __future__ import annotations

import argparse

from metadist.launch.slurm import (
    LAUNCH_KEYS,
    check_training_config,
    find_sbatch,
    job_from_settings,
    submit_script,
    write_script,
)

DESCRIPTION = "Slurm jobs that run `torchrun` on every node and survive preemption by requeueing."


def _cmd_submit(args: argparse.Namespace) -> int:
    job, run_dir = job_from_settings(args.settings, sbatch_args=args.sbatch_arg)
    check_training_config(job)
    if args.dry_run:
        print(job.render(), end="")
        return 0
    find_sbatch()
    # Logs go to <run_dir>/slurm/; Slurm does not create the directory of --output.
    (run_dir / "slurm").mkdir(parents=True, exist_ok=True)
    script = write_script(job, run_dir / "slurm" / "job.sbatch")
    job_id = submit_script(script)
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
    submit.add_argument("settings", nargs="*", metavar="KEY=VALUE")
    submit.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    submit.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="an extra #SBATCH option, verbatim (repeatable), e.g. --sbatch-arg=--exclusive",
    )
    submit.set_defaults(func=_cmd_submit)
