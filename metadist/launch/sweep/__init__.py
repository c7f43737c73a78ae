"""Hyper-parameter sweeps: an Optuna study whose trials are separate training runs.

`metadist sweep experiment=NAME [overrides] --trials N --space FILE [--sweep-dir DIR]
[--launcher local|slurm]` keeps the study in `<sweep_dir>/study.db` (SQLite; running the
same command again continues it) and runs every trial as its own `metadist.train` run in
`<sweep_dir>/trials/NNNN/`:

- each trial has its own seed (`trainer.seed`), hence its own stratified meta-train /
  meta-val split, while the meta-test split is pinned to the one of `--test-seed` in every
  trial (`data.pinned_test_units`), so no trial ever trains or validates on test units;
- the validation metric is read back from the run's `metrics.jsonl` while it trains and
  reported to Optuna, whose pruner can stop a poor trial early (its processes are
  signalled to checkpoint and exit);
- `best.yaml` (the best configuration as overrides) and `trials.md` (a table of every
  trial) are rewritten after each trial;
- a local trial's training dies with the driver (its parent-death signal is SIGTERM, so
  it checkpoints and exits, even when the driver is SIGKILLed); a continued sweep first
  stops any attempt still running (local process group, Slurm element), then runs each
  cut-off trial again in its own run directory, resuming from its last checkpoint;
- the space is checked (every choice composed into a trial config) before `study.db`
  exists, and an empty, foreign or corrupt `study.db` is refused, as is one holding
  another Optuna study or a sweep made for other settings (overrides, space, metric,
  direction, seeds, world size): only the same sweep is continued, and nothing is written
  to a study refused.

Local trials run as subprocesses (under torchrun with `--nproc-per-node` > 1); Slurm trials
run as elements of an array job, one element per trial.

The package, one room per concern: `space` (the search space file), `settings` (the
sweep's settings, a trial's config, split and command), `study` (the Optuna study, its
lock and interrupted trials), `runners` (local process groups, Slurm array elements),
`metrics` (reading a trial's meta-val metric), `outcome` (completed or failed, and
why), `stops` (the stop signals a driver takes), `driver` (`run_sweep`), `reports`
(`trials.md`, `best.yaml`) and `rerun`. The command line, `metadist sweep`, is
`metadist.commands.sweep`.
"""

from metadist.launch.sweep.driver import run_sweep
from metadist.launch.sweep.metrics import read_val_metric
from metadist.launch.sweep.rerun import rerun_trial
from metadist.launch.sweep.runners import LocalTrial, SlurmArrayWave, SlurmTrial
from metadist.launch.sweep.settings import (
    BEST_FILE,
    COMMAND_FILE,
    LOG_FILE,
    SPLIT_FILE,
    STUDY_FILE,
    STUDY_NAME,
    TABLE_FILE,
    SweepSettings,
    TrialPlan,
    check_space,
    compute_split,
    decode_params,
    plan_trial,
)
from metadist.launch.sweep.space import ParamSpec, format_override, load_search_space
from metadist.launch.sweep.study import enqueue_trial, open_study

__all__ = [
    "BEST_FILE",
    "COMMAND_FILE",
    "LOG_FILE",
    "SPLIT_FILE",
    "STUDY_FILE",
    "STUDY_NAME",
    "TABLE_FILE",
    "LocalTrial",
    "ParamSpec",
    "SlurmArrayWave",
    "SlurmTrial",
    "SweepSettings",
    "TrialPlan",
    "check_space",
    "compute_split",
    "decode_params",
    "enqueue_trial",
    "format_override",
    "load_search_space",
    "open_study",
    "plan_trial",
    "read_val_metric",
    "rerun_trial",
    "run_sweep",
]
