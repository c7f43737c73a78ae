"""Where a run's logs go, checked before anything is built or written.

Rank 0 writes `metrics.jsonl` in the run directory, and with their settings on,
TensorBoard events under `tensorboard/` and the wandb run under `wandb/`. A file in the
way of one of those directories, a directory in place of `metrics.jsonl`, one that
cannot be written (read-only, no permission) or the wandb package missing would
otherwise stop the run with a traceback after the store and the learner were built, and
after the run directory's files were rewritten; `check_log_sinks` says it in one line
naming the setting first.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from metadist.train.logging import METRICS_FILE, TENSORBOARD_DIR, WANDB_DIR, wandb_mode
from metadist.train.logging_config import LoggingConfig


def check_log_sinks(run_dir: Path, config: LoggingConfig) -> None:
    """Raises if a log the run would write under `run_dir` cannot be written there.

    Raises:
        ValueError: naming the setting and the path at fault.
    """
    remedy = "move it away or use another run_dir"
    metrics = run_dir / METRICS_FILE
    if metrics.exists() and not metrics.is_file():
        raise ValueError(f"{metrics} is not a file: it is where the run's metrics go; {remedy}")
    if metrics.is_file() and not os.access(metrics, os.W_OK):
        raise ValueError(f"cannot write the run's metrics {metrics}: {_refusal(metrics)}")
    if config.tensorboard:
        _check_directory(run_dir / TENSORBOARD_DIR, "logging.tensorboard=true", remedy)
    mode = wandb_mode(config.wandb.mode)
    if mode != "disabled":
        setting = f"logging.wandb.mode={mode}"
        if importlib.util.find_spec("wandb") is None:
            raise ValueError(
                f"{setting} needs the wandb package: pip install wandb, or set "
                "logging.wandb.mode=disabled"
            )
        _check_directory(run_dir / WANDB_DIR, setting, remedy)


def _check_directory(path: Path, setting: str, remedy: str) -> None:
    """Raises where `setting`'s directory `path` is a file or cannot be written."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{setting} writes to {path}, which is not a directory; {remedy}")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{setting} writes to {path}: {_refusal(path)}")


def _refusal(path: Path) -> str:
    """Why `path` cannot be written, and what to do."""
    reason = "read-only file system" if _read_only(path) else "permission denied"
    return f"{reason}; make it writable, or use another run_dir"


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
