"""Whether a trial's training finished, and if not why: what the driver records and what
`--rerun` checks."""

from __future__ import annotations

import math

from metadist.launch.sweep.settings import SweepSettings, TrialPlan
from metadist.train.resume import finished_before


def trial_failure(
    plan: TrialPlan, settings: SweepSettings, exit_code: int, points: list[tuple[int, float]]
) -> str | None:
    """Why a trial whose training exited with `exit_code` did not complete, or `None`.

    A training completes when it exits with status 0 and a finite last meta-val value
    (`points`, as `read_val_metric` reads them), either at its last meta-step or before
    it where its run directory holds a run stopped early by `selection.patience`
    (`finished_before`); one that exited early for any other reason (a stop signal from
    elsewhere) did not.
    """
    last_step, final = points[-1] if points else (0, float("nan"))
    if exit_code != 0:
        return f"exit status {exit_code}"
    if last_step != plan.num_steps and not finished_before(
        plan.overrides, plan.run_dir, settings.config_dir
    ):
        return f"stopped at step {last_step} of {plan.num_steps}"
    if not math.isfinite(final):
        return f"val {settings.metric} is {final}"
    return None
