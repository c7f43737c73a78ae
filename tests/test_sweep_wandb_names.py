"""A sweep's trials each log to a wandb run of their own name (`trial-NNNN`, a rerun
`trial-NNNN-rerun-K`) in one group shared by the sweep: they were all named after the
experiment, indistinguishable in wandb. The trials' configs are composed from their
planned overrides, and the names reach a real wandb run (offline)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from metadist.launch.sweep import SweepSettings, plan_trial
from metadist.train.compose import load_config

BASE = ["experiment=sinusoid_maml", "trainer.eval_every=10"]


def _settings(tmp_path, overrides=()):
    return SweepSettings(
        overrides=[*BASE, *overrides], space=[], sweep_dir=tmp_path / "lr", num_trials=2
    )


def _wandb_of(plan):
    wandb = load_config(plan.overrides).logging.wandb
    return wandb.name, wandb.group


@pytest.mark.slow  # the same path runs in the suite's other tests; this one costs seconds
def test_each_trial_has_its_own_wandb_name_in_the_sweeps_group(tmp_path):
    settings = _settings(tmp_path)
    plans = [
        plan_trial(settings, n, n, {}, tmp_path / "lr" / "trials" / f"{n:04d}") for n in (0, 1)
    ]
    assert [_wandb_of(plan) for plan in plans] == [
        ("trial-0000", "sweep-lr"),
        ("trial-0001", "sweep-lr"),
    ]
    rerun = plan_trial(
        settings, 1, 1, {}, tmp_path / "lr" / "reruns" / "0001-0", "trial-0001-rerun-0"
    )
    assert _wandb_of(rerun) == ("trial-0001-rerun-0", "sweep-lr")
    # the command a trial runs carries them
    assert "logging.wandb.name=trial-0001" in plans[1].train_command(settings)


@pytest.mark.slow  # the same path runs in the suite's other tests; this one costs seconds
def test_a_group_given_with_the_sweep_is_kept(tmp_path):
    settings = _settings(tmp_path, ["logging.wandb.group='my lr sweep'"])
    plan = plan_trial(settings, 3, 3, {}, tmp_path / "lr" / "trials" / "0003")
    assert _wandb_of(plan) == ("trial-0003", "my lr sweep")


def test_a_name_given_with_the_sweep_is_refused(tmp_path):
    settings = _settings(tmp_path, ["logging.wandb.name=mine"])
    with pytest.raises(ValueError, match=re.escape("logging.wandb.name is set by the sweep")):
        settings.validate()


# the run's wandb run started as a training starts it, offline; prints its name and group
START = """
import json, sys
from pathlib import Path
from metadist.train.logging_config import LoggingConfig, WandbConfig
from metadist.train.wandb_run import start_wandb

name = None if sys.argv[2] == "-" else sys.argv[2]
config = LoggingConfig(wandb=WandbConfig(name=name, group="sweep-lr"))
run = start_wandb(config, Path(sys.argv[1]), mode="offline", experiment="sinusoid_maml",
                  run_id="0123456789abcdef", run_config={})
print("FOUND " + json.dumps([run.run.name, run.run.group]))
run.finish()
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "shown"), [("trial-0002", "trial-0002"), ("-", "sinusoid_maml")])
def test_the_wandb_run_takes_the_name_and_group(tmp_path, name, shown):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    argv = [sys.executable, "-c", START, str(tmp_path), name]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("FOUND "))
    assert json.loads(line.removeprefix("FOUND ")) == [shown, "sweep-lr"]
