"""`metadist sweep --rerun N`: run a completed trial again and check its metric."""

from __future__ import annotations

import os
import time
from pathlib import Path

from metadist.launch.sweep.metrics import read_val_metric
from metadist.launch.sweep.outcome import trial_failure
from metadist.launch.sweep.runners import LocalTrial
from metadist.launch.sweep.settings import (
    LOG_FILE,
    STUDY_FILE,
    SweepSettings,
    decode_params,
    plan_trial,
)
from metadist.launch.sweep.space import ParamSpec
from metadist.launch.sweep.stops import stops_deferred, stops_raised
from metadist.launch.sweep.study import open_study


def rerun_trial(
    sweep_dir: str | os.PathLike, number: int, poll_seconds: float = 1.0, log=print
) -> tuple[float, float]:
    """Runs a completed trial again, locally, with its parameters, seed and world size.

    The sweep's settings are read from its study. The rerun goes to
    `<sweep_dir>/reruns/NNNN-K/`. Returns `(recorded, rerun)` values of the metric; on
    CPU they are equal bit for bit.

    Raises:
        FileNotFoundError: no study in `sweep_dir`.
        ValueError: no such trial, or it did not complete, or the rerun failed.
    """
    from optuna.trial import TrialState

    sweep_dir = Path(sweep_dir).resolve()
    if not (sweep_dir / STUDY_FILE).is_file():
        raise FileNotFoundError(f"no sweep in {sweep_dir} ({STUDY_FILE} missing)")
    reading = SweepSettings(overrides=[], space=[], sweep_dir=sweep_dir, num_trials=1)
    study = open_study(reading, create=False)
    meta = study.user_attrs.get("sweep")
    if meta is None:
        raise ValueError(f"{sweep_dir / STUDY_FILE} is not a metadist sweep")
    settings = SweepSettings(
        overrides=list(meta["overrides"]),
        space=[ParamSpec(**{**p, "choices": tuple(p["choices"])}) for p in meta["space"]],
        sweep_dir=sweep_dir,
        num_trials=1,
        metric=meta["metric"],
        direction=meta["direction"],
        base_seed=meta["base_seed"],
        test_seed=meta["test_seed"],
        nproc_per_node=meta["world_size"],
        poll_seconds=poll_seconds,
        config_dir=meta["config_dir"],
    )
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    if number not in trials:
        raise ValueError(f"trial {number} is not in the study (it has {len(trials)} trials)")
    frozen = trials[number]
    if frozen.state != TrialState.COMPLETE:
        raise ValueError(f"trial {number} is {frozen.state.name.lower()}, not complete")
    reruns = settings.sweep_dir / "reruns"
    attempt = 0
    while (reruns / f"{number:04d}-{attempt}").exists():
        attempt += 1
    run_dir = reruns / f"{number:04d}-{attempt}"
    params = decode_params(settings, frozen.params)
    name = f"trial-{number:04d}-rerun-{attempt}"  # beside the trial's own wandb run
    plan = plan_trial(settings, number, frozen.user_attrs["seed"], params, run_dir, name)
    with stops_deferred():  # a stop signal waits until the training is tracked
        runner = LocalTrial(plan, settings)
    try:
        with stops_raised():  # SIGTERM and SIGHUP stop it as Ctrl-C does
            while runner.poll() is None:
                time.sleep(settings.poll_seconds)
    except BaseException:
        with stops_deferred(deliver=False):  # the training checkpoints and exits
            runner.stop()
        raise
    runner.finish()
    points = read_val_metric(run_dir, settings.metric)
    exit_code = runner.poll()
    assert exit_code is not None  # waited for above
    reason = trial_failure(plan, settings, exit_code, points, runner.log_path, runner.log_offset)
    if reason is not None:
        raise ValueError(f"the rerun of trial {number} failed ({reason}); see {run_dir / LOG_FILE}")
    log(
        f"trial {number}: recorded {settings.metric}={frozen.value!r}, rerun {points[-1][1]!r} "
        f"({run_dir})"
    )
    return float(frozen.value), points[-1][1]
