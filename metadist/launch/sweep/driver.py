"""`run_sweep`: ask the study for trials, run them, report their metric, prune, repeat."""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from pathlib import Path
from typing import Any

from metadist.launch.sweep.metrics import read_val_metric
from metadist.launch.sweep.outcome import trial_failure
from metadist.launch.sweep.reports import format_params, write_reports
from metadist.launch.sweep.runners import LocalTrial, SlurmArrayWave, wave_dir
from metadist.launch.sweep.settings import (
    STUDY_FILE,
    SweepSettings,
    TrialPlan,
    check_space,
    plan_trial,
)
from metadist.launch.sweep.stops import stops_deferred, stops_raised
from metadist.launch.sweep.study import (
    check_meta,
    open_study,
    recover_interrupted,
    run_again_later,
    sweep_lock,
)


def run_sweep(settings: SweepSettings, log=print) -> Any:
    """Runs (or continues) the sweep until `num_trials` trials have completed or been pruned.

    The settings and the search space are checked (every choice composed into a trial
    config) before anything is written, so a typo leaves no study behind.

    Returns:
        The Optuna study.

    Raises:
        ValueError: bad settings, a trial configuration the training rejects, a sweep
            directory holding another sweep or an unreadable study, or `max_failures`
            failed trials (naming their logs).
    """
    settings.validate()
    settings.sweep_dir = settings.sweep_dir.resolve()
    if not _study_exists(settings):
        check_space(settings)
    with sweep_lock(settings.sweep_dir):
        study = open_study(settings)
        check_meta(study, settings)
        recover_interrupted(study, log)
        driver = _Driver(settings, study, log)
        try:
            with stops_raised():  # SIGTERM and SIGHUP stop it as Ctrl-C does
                driver.run()
        except BaseException:
            with stops_deferred(deliver=False):  # a second one must not cut the requeue short
                driver.requeue_running()
            raise
        finally:
            write_reports(study, settings)
        return study


def _study_exists(settings: SweepSettings) -> bool:
    return (settings.sweep_dir / STUDY_FILE).exists()


class _Driver:
    """The state of one sweep invocation: the running trials and what was reported."""

    def __init__(self, settings: SweepSettings, study, log) -> None:
        self.settings = settings
        self.study = study
        self.log = log
        self.running: dict[int, tuple[Any, Any]] = {}  # number -> (optuna trial, runner)
        self.reported: dict[int, int] = {}  # number -> last step reported to the pruner
        self.failures: list[str] = []
        self.wave = len(list((settings.sweep_dir / "slurm").glob("wave*")))

    def run(self) -> None:
        while True:
            self.start_trials()
            if not self.running:
                return
            time.sleep(self.settings.poll_seconds)
            for number in list(self.running):
                self.check_trial(number)

    # ---- starting ---------------------------------------------------------------------
    def start_trials(self) -> None:
        """Asks the study for as many trials as there are free slots and starts them."""
        from optuna.trial import TrialState

        done = self.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)
        )
        wanted = self.settings.num_trials - len(done) - len(self.running)
        free = self.settings.parallel - len(self.running)
        if self.settings.launcher == "slurm" and self.running:
            free = 0  # a wave is finished before the next one is submitted
        plans = []
        # a stop signal waits until the trials being started are tracked, so that none is left
        # running unseen.
        with stops_deferred():
            for _ in range(max(0, min(free, wanted))):
                trial = self.study.ask()
                plan = _plan_asked_trial(self.study, trial, self.settings)
                plans.append((trial, plan))
                if self.settings.launcher == "local":
                    runner = LocalTrial(plan, self.settings)
                    trial.set_user_attr("process", runner.process)
                    self.running[trial.number] = (trial, runner)
            if plans and self.settings.launcher == "slurm":
                self.submit_wave(plans)
        for trial, plan in plans:
            self.log(
                f"trial {trial.number} started: seed {plan.seed}, {format_params(plan.params)}"
            )

    def submit_wave(self, plans: list[tuple[Any, TrialPlan]]) -> None:
        """Submits the asked trials as one array job; where sbatch refuses it, they are
        failed trials (not trials left running), the wave's files are removed, and the
        sweep stops with sbatch's reason."""
        from optuna.trial import TrialState

        try:
            array = SlurmArrayWave([plan for _, plan in plans], self.settings, self.wave)
        except (ValueError, OSError) as error:
            for trial, _ in plans:
                trial.set_user_attr("failure", f"not submitted: {error}")
                self.study.tell(trial, state=TrialState.FAIL)
            shutil.rmtree(wave_dir(self.settings, self.wave), ignore_errors=True)
            numbers = ", ".join(str(trial.number) for trial, _ in plans)
            raise ValueError(f"{error} (trials {numbers} recorded as failed)") from None
        self.wave += 1
        for (trial, _), runner in zip(plans, array.trials, strict=True):
            trial.set_user_attr("slurm_job", runner.element)
            self.running[trial.number] = (trial, runner)

    # ---- watching ---------------------------------------------------------------------
    def check_trial(self, number: int) -> None:
        """Reports a running trial's new points, prunes it or records how it ended."""
        trial, runner = self.running[number]
        exit_code = runner.poll()
        points = read_val_metric(runner.plan.run_dir, self.settings.metric)
        prune_point = self.report(
            number, trial, points, running=exit_code is None, last=runner.plan.num_steps
        )
        if prune_point is not None:
            self.prune(number, prune_point)
        elif exit_code is not None:
            runner.finish()
            del self.running[number]
            self.finish(number, trial, runner, exit_code, points)
        else:
            return
        write_reports(self.study, self.settings)

    def report(
        self, number: int, trial, points, *, running: bool, last: int | None = None
    ) -> tuple | None:
        """Reports every new point to the pruner; the point it prunes at, if any.

        Every point is reported, not only the last of a poll: a fast run writes many
        points between polls, and the pruner compares trials at equal steps. A point at
        the training's `last` step is never pruned: the trial has finished training
        (it may still be writing its checkpoint), and it completes.
        """
        for step, value in points:
            if step <= self.reported.get(number, -1):
                continue
            if math.isfinite(value):
                trial.report(value, step)
            self.reported[number] = step
            finished = last is not None and step >= last
            if running and not finished and trial.should_prune():
                return step, value
        return None

    def prune(self, number: int, point: tuple[int, float]) -> None:
        from optuna.trial import TrialState

        trial, runner = self.running.pop(number)
        runner.stop()
        self.study.tell(trial, state=TrialState.PRUNED)
        self.log(f"trial {number} pruned at step {point[0]}: {self.settings.metric}={point[1]:.6g}")

    def finish(self, number: int, trial, runner, exit_code: int, points) -> None:
        from optuna.trial import TrialState

        reason = trial_failure(
            runner.plan, self.settings, exit_code, points, runner.log_path, runner.log_offset
        )
        if reason is None:
            final = points[-1][1]
            self.study.tell(trial, final)
            self.log(f"trial {number} finished: {self.settings.metric}={final:.6g}")
            return
        trial.set_user_attr("failure", reason)  # for trials.md
        self.study.tell(trial, state=TrialState.FAIL)
        self.failures.append(f"trial {number} ({reason}, see {runner.log_path})")
        self.log(f"trial {number} failed: {reason}; log {runner.log_path}")
        if len(self.failures) >= self.settings.max_failures:
            raise ValueError(f"{len(self.failures)} trials failed: " + "; ".join(self.failures))

    # ---- stopping ---------------------------------------------------------------------
    def requeue_running(self) -> None:
        """The driver stops: its running trials checkpoint, exit and are queued again
        (all asked at once, then waited for: not one grace period after another)."""
        for _, runner in self.running.values():
            runner.request_stop()
        for number, (trial, runner) in self.running.items():
            runner.stop()
            with contextlib.suppress(Exception):
                run_again_later(self.study, trial)
            self.log(f"trial {number} stopped; it runs again when the sweep is continued")


def _plan_asked_trial(study, trial, settings: SweepSettings) -> TrialPlan:
    """Seed, parameters and run directory of a trial just asked from the study.

    A trial queued again after an interruption keeps the seed and run directory of its
    first attempt (its training resumes from the last checkpoint there).
    """
    from optuna.trial import TrialState

    seed = trial.user_attrs.get("seed")
    if seed is None:
        seed = settings.base_seed + trial.number
    trial.set_user_attr("seed", seed)
    params = {spec.name: spec.suggest(trial) for spec in settings.space}
    run_dir = trial.user_attrs.get("run_dir")
    run_dir = settings.sweep_dir / "trials" / f"{trial.number:04d}" if run_dir is None else run_dir
    trial.set_user_attr("run_dir", str(run_dir))
    try:
        return plan_trial(settings, trial.number, seed, params, Path(run_dir))
    except (ValueError, FileNotFoundError) as error:
        trial.set_user_attr("failure", " ".join(str(error).split()))
        study.tell(trial, state=TrialState.FAIL)
        raise
