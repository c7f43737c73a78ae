"""Whether a trial's training finished, and if not why: what the driver records and what
`--rerun` checks."""

from __future__ import annotations

import math
from pathlib import Path

from metadist.launch.sweep.settings import SweepSettings, TrialPlan
from metadist.train.resume import finished_before


def trial_failure(
    plan: TrialPlan,
    settings: SweepSettings,
    exit_code: int,
    points: list[tuple[int, float]],
    log_path: Path | None = None,
    log_offset: int = 0,
) -> str | None:
    """Why a trial whose training exited with `exit_code` did not complete, or `None`.

    A training completes when it exits with status 0 and a finite last meta-val value
    (`points`, as `read_val_metric` reads them), either at its last meta-step or before
    it where its run directory holds a run stopped early by `selection.patience`
    (`finished_before`); one that exited early for any other reason (a stop signal from
    elsewhere) did not. A training that failed is named by its own one-line error (a
    meta-loss that is not finite, ...), the last one its attempt wrote to `log_path`
    from `log_offset` on, where there is one.
    """
    last_step, final = points[-1] if points else (0, float("nan"))
    if exit_code != 0:
        said = _last_error(log_path, log_offset) if log_path is not None else None
        return f"exit status {exit_code}" + (f": {said}" if said else "")
    if last_step != plan.num_steps and not finished_before(
        plan.overrides, plan.run_dir, settings.config_dir
    ):
        return f"stopped at step {last_step} of {plan.num_steps}"
    if not math.isfinite(final):
        return f"val {settings.metric} is {final}"
    return None


def _last_error(log_path: Path, offset: int) -> str | None:
    """The message of the last `PROG: error: MESSAGE` line written to `log_path` from byte
    `offset` on (the attempt's own part of a log that earlier attempts appended to)."""
    try:
        with open(log_path, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    errors = [line.partition(_ERROR)[2].strip() for line in text.splitlines() if _ERROR in line]
    return next((error for error in reversed(errors) if error), None)


_ERROR = ": error: "  # how every metadist command (and the training) says what went wrong
