"""What rank 0 reports: a progress bar, JSON-lines metrics and Weights & Biases.

Every other rank gets a logger that does nothing: only errors reach their output.

Files in the run directory:
    metrics.jsonl   one JSON object per line: {"step", "split", "loss", "tasks_per_s", ...}
    config.yaml     the resolved configuration of the run
    tensorboard/    TensorBoard scalars (`logging.tensorboard=true`)
    wandb/          the offline wandb run (`wandb sync runs/NAME/wandb/offline-run-*`)

`metadist.train.log_sinks` checks these can be written before a run is built.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metadist.diskspace import needs_space
from metadist.durable import atomic_write_text
from metadist.progress import Progress
from metadist.train.logging_config import LoggingConfig
from metadist.train.wandb_run import start_wandb

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"  # wandb's own name for its directory under `dir=`


def new_run_id() -> str:
    """A fresh run id (lower-case hex, as wandb accepts)."""
    return uuid.uuid4().hex[:16]


class RunLogger:
    """Rank 0's reporter.

    Args:
        run_dir: the run directory.
        config: the logging section.
        experiment: the experiment name (the wandb run's, unless `logging.wandb.name`).
        run_id: the run's id, kept in checkpoints so a resumed run continues the same
            wandb run.
        start_step: the step training starts from; metrics lines after it (left by an
            interrupted attempt) are dropped so the file reads as one clean run.
        total_steps: the run's meta-steps (the progress bar's total).
        run_config: the resolved configuration, stored with the run.
    """

    def __init__(
        self,
        run_dir: Path,
        config: LoggingConfig,
        *,
        experiment: str,
        run_id: str,
        start_step: int,
        total_steps: int,
        run_config: dict[str, Any],
    ) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.run_id = run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        _drop_lines_after(self.metrics_path, start_step)
        self._metrics = open(self.metrics_path, "a", encoding="utf-8")  # noqa: SIM115
        _write_config(self.run_dir / "config.yaml", run_config)
        self._wandb = None
        # A run with nothing left to train (the command run again once it finished) opens
        # no wandb run and no TensorBoard file: they would only add an empty session.
        trains = start_step < total_steps
        mode = wandb_mode(config.wandb.mode)
        if mode != "disabled" and trains:
            self._wandb = start_wandb(
                config,
                self.run_dir,
                mode=mode,
                experiment=experiment,
                run_id=run_id,
                run_config=run_config,
            )
        self._tensorboard = None
        if config.tensorboard and trains:
            self._tensorboard = _start_tensorboard(self.run_dir, start_step)
        # A bar on a terminal; elsewhere (nohup, Slurm .out) a line every
        # `progress_every` seconds, so a long run is never silent.
        self._display = Progress(
            config.progress, every=config.progress_every, stream=sys.stderr
        ).__enter__()
        self._steps = self._display.counter(experiment, total_steps, "steps", start=start_step)

    def progress(self, step: int, loss: float, tasks_per_s: float) -> None:
        """Moves the progress to `step` (cheap; call every step)."""
        self._steps.update(step, f"loss {loss:.4g}, {tasks_per_s:,.0f} tasks/s")

    def log(self, step: int, split: str, values: dict[str, float]) -> None:
        """Writes one metrics record (`split` is `train` or `val`) to every sink."""
        record = {"step": int(step), "split": split, "time": round(time.time(), 3)}
        record.update({k: _number(v) for k, v in values.items()})
        with needs_space(self.metrics_path, "the run's metrics"):
            self._metrics.write(json.dumps(record) + "\n")
            self._metrics.flush()
        if self._wandb is not None:
            self._wandb.log({f"{split}/{k}": v for k, v in values.items()}, step=int(step))
        if self._tensorboard is not None:
            for key, value in values.items():
                number = _number(value)
                if isinstance(number, (int, float)):
                    self._tensorboard.add_scalar(f"{split}/{key}", number, int(step))
            self._tensorboard.flush()

    def message(self, text: str) -> None:
        """A line for the person watching (above the progress bar)."""
        self._display.print(text)

    def close(self) -> None:
        self._display.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if not self._metrics.closed:
            self._metrics.close()


class NullLogger:
    """The logger of ranks other than 0: reports nothing."""

    run_id = ""

    def progress(self, step: int, loss: float, tasks_per_s: float) -> None:
        """Ranks other than 0 show no progress bar."""

    def log(self, step: int, split: str, values: dict[str, float]) -> None:
        """Only rank 0 writes metrics."""

    def message(self, text: str) -> None:
        """Only rank 0 prints messages; errors are raised, not logged."""

    def close(self) -> None:
        """Nothing was opened."""


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a run's `metrics.jsonl`, in order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _number(value: Any) -> Any:
    value = float(value)
    return value if math.isfinite(value) else str(value)


def _drop_lines_after(path: Path, step: int) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def _write_config(path: Path, run_config: dict[str, Any]) -> None:
    from omegaconf import OmegaConf

    atomic_write_text(path, OmegaConf.to_yaml(OmegaConf.create(run_config)))


# wandb modes from the most to the least restrictive; `dryrun` and `run` are old names.
_WANDB_MODES = ("disabled", "offline", "online")
_WANDB_ALIASES = {"dryrun": "offline", "run": "online"}


def wandb_mode(configured: str, environ: dict[str, str] | None = None) -> str:
    """The wandb mode a run uses: `logging.wandb.mode`, unless `WANDB_MODE` asks for less.

    The environment can only restrict: `WANDB_MODE=disabled` turns wandb off and
    `WANDB_MODE=offline` keeps an `online` config offline; `WANDB_MODE=online` does not
    turn on the network for a config that keeps it off.

    Raises:
        ValueError: `WANDB_MODE` holds something else than a wandb mode.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    wanted = env.get("WANDB_MODE", "").strip().lower()
    if not wanted:
        return configured
    wanted = _WANDB_ALIASES.get(wanted, wanted)
    if wanted not in _WANDB_MODES:
        raise ValueError(
            f"environment variable WANDB_MODE={env['WANDB_MODE']!r} is not a wandb mode "
            f"({', '.join(_WANDB_MODES)})"
        )
    return min(configured, wanted, key=_WANDB_MODES.index)


def _start_tensorboard(run_dir: Path, start_step: int) -> Any:
    """A TensorBoard `SummaryWriter` into `<run_dir>/tensorboard`.

    A run starting at `start_step` (0: from scratch, where an attempt stopped before its
    first checkpoint may have written events) purges the events after it that an
    interrupted attempt left (as `metrics.jsonl` drops its lines), so that no step is
    shown twice.

    Raises:
        ValueError: the tensorboard package is not installed.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ValueError(
            "logging.tensorboard=true needs the tensorboard package: "
            "pip install 'metadist[tensorboard]'"
        ) from None
    return SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=start_step + 1)
