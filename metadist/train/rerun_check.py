"""A run directory's settings checked before a training is started in it.

A command that starts `metadist train` in a run directory it chooses itself (the demo:
`--out`'s `run/`) asks first whether the run there has other settings, so that the
refusal names the remedy that works for that command, not the training's `run_dir=...`,
which the command does not take, and comes before the training is started. `metadist
slurm submit` asks before it submits, so that the refusal does not wait for the job to
leave the queue.
"""

from __future__ import annotations

import os
from pathlib import Path

from metadist.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from metadist.train.compose import load_config
from metadist.train.resume import check_same_run


def check_same_settings(
    overrides: list[str],
    run_dir: Path,
    new_run: str | None,
    config_dir: str | os.PathLike | None = None,
) -> None:
    """Refuses a training of `overrides` (in the experiments of `config_dir`, where given)
    in `run_dir` where the run there has other settings, as the training would on
    resuming it (`check_same_run`), its message naming `new_run`: how to start a new run
    (None: a free `run_dir=...`, as the training's own refusal says).
    Anything else (no checkpoint, an unreadable one, a bad config) passes: the training
    then says what is wrong.

    Raises:
        ValueError: naming the first setting that differs and `new_run`.
    """
    try:
        found = latest_checkpoint(run_dir)
        if found is None:
            return
        config = load_config(overrides, config_dir)
        state = load_checkpoint(*found)
    except (ValueError, TypeError, KeyError, OSError, CheckpointError):
        return
    check_same_run(state.get("config", {}), config.to_dict(), run_dir, new_run=new_run)
