"""A training's wandb run, with wandb's process-wide state confined to it.

wandb keeps settings for the whole process (`wandb.setup`: the mode, its console's
silence), read once from the environment, and a service process named in
`WANDB_SERVICE`. A training started from Python (`metadist.fit` in a notebook) must
leave none of its own settings behind for the user's code that runs after it, and must
not change the settings of a wandb the user had set up before it:

- `logging.wandb.quiet` is a setting of the run (`wandb.Settings(silent=True)`), never
  `WANDB_SILENT` in the environment; a `WANDB_SILENT` the user set still decides;
- where wandb was not set up in this process yet, the run sets it up with its own mode
  and silence (so that an offline run starts no online analytics) and tears it down
  when it finishes: the next `wandb.init` of the process starts from the environment;
- where it was, the run's mode and silence are given to `wandb.init` alone, and the
  user's setup is left as it was;
- a wandb run the user has open goes on: the training's is a new run beside it
  (`reinit="create_new"`), not one that finishes it or logs into it, and it never becomes
  `wandb.run`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from metadist.train.logging_config import LoggingConfig


class WandbRun:
    """A started wandb run; `finish` also ends the wandb setup the run made.

    Args:
        run: the `wandb.Run`.
        owns_setup: whether starting the run set wandb up in this process.
    """

    def __init__(self, run: Any, owns_setup: bool) -> None:
        self.run = run
        self.owns_setup = owns_setup

    def log(self, values: dict[str, Any], step: int) -> None:
        self.run.log(values, step=step)

    def finish(self) -> None:
        try:
            self.run.finish()
        finally:
            if self.owns_setup:
                _teardown()


def start_wandb(
    config: LoggingConfig,
    run_dir: Path,
    *,
    mode: str,
    experiment: str,
    run_id: str,
    run_config: dict,
) -> WandbRun:
    """Starts (or, with the same `run_id`, resumes) the run's wandb run under `run_dir`.

    Args:
        config: the logging section (`logging.wandb.*`).
        run_dir: the run directory; wandb writes under `run_dir/wandb`.
        mode: `online` or `offline` (`metadist.train.logging.wandb_mode`).
        experiment: the experiment's name, the run's name unless `logging.wandb.name`.
        run_id: the wandb run id, kept in the run's checkpoints.
        run_config: the resolved configuration, stored with the wandb run.
    """
    import wandb

    settings = _run_settings(config, mode)
    set_up = _set_up()
    owns_setup = set_up is False
    if set_up is not True:
        # Before `init`, wandb builds its process-wide settings from the environment (online
        # unless WANDB_MODE says otherwise) and its analytics would probe the server from a
        # background thread: give it the run's settings first, and turn the analytics off.
        wandb.setup(wandb.Settings(**settings))
    if mode != "online":
        with contextlib.suppress(ImportError, AttributeError):
            from wandb.analytics.opentelemetry import opentelemetry_proxy

            opentelemetry_proxy.disable()
    try:
        run = wandb.init(
            project=config.wandb.project,
            entity=config.wandb.entity,
            name=config.wandb.name or experiment,
            group=config.wandb.group,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=run_config,
            settings=wandb.Settings(**settings, **_beside_other_runs()),
        )
    except BaseException:
        if owns_setup:
            _teardown()
        raise
    return WandbRun(run, owns_setup)


def _run_settings(config: LoggingConfig, mode: str) -> dict[str, Any]:
    """The wandb settings of the run: its mode, and its silence unless the user set one."""
    settings: dict[str, Any] = {"mode": mode}
    if config.wandb.quiet and "WANDB_SILENT" not in os.environ:
        settings["silent"] = True
    return settings


def _beside_other_runs() -> dict[str, Any]:
    """The setting that starts the run beside a run the process has open, where wandb
    has it (`reinit="create_new"`); an older wandb has not, and keeps its default."""
    import wandb

    try:
        wandb.Settings(reinit="create_new")
    except (ValueError, TypeError, wandb.errors.UsageError):
        return {}
    return {"reinit": "create_new"}


def _set_up() -> bool | None:
    """Whether wandb is already set up in this process (by the user, say); `None` where
    this wandb does not tell.

    wandb does not say so publicly: its module's `_singleton` (an older wandb: the class's
    `_instance`) is read. Where neither is found, the run still sets wandb up with its own
    mode (an offline run must start no online analytics) but never tears it down, since the
    setup may be the user's.
    """
    import wandb
    from wandb.sdk import wandb_setup

    if wandb.run is not None:
        return True
    if hasattr(wandb_setup, "_singleton"):
        return wandb_setup._singleton is not None
    holder = getattr(wandb_setup, "_WandbSetup", None)
    if holder is not None and hasattr(holder, "_instance"):
        return holder._instance is not None
    return None


def _teardown() -> None:
    import wandb

    wandb.teardown()
