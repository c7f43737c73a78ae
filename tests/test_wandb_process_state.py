"""A training with wandb started from Python (`metadist.fit`) leaves no wandb state of its
own in the process: no `WANDB_*` variable in the environment, no quiet or offline wandb
for the user's next `wandb.init`, a wandb the user set up before it unchanged, a run the
user has open still open (not finished by the training's), and no wandb run of its own
still open when it stops with an error (real trainings, wandb offline, each in a fresh
Python process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.tiny_runs import tiny_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# argv: store, run_dir, user_dir, "fresh" (wandb untouched before the training), "set-up"
# (the user set wandb up first, disabled) or "fails" (the training stops with an error after
# its wandb run started: pre-training asked of a sampler whose labelled examples fail) or
# "active" (the user has a wandb run of their own open);
# prints what the user's code finds afterwards.
SCRIPT = """
import json, os, sys
import wandb
import metadist

store, run_dir, user_dir, case = sys.argv[1:]
if case == "set-up":
    wandb.setup(wandb.Settings(mode="disabled"))
if case == "active":
    mine = wandb.init(project="mine", dir=user_dir, mode="offline")
if case == "fails":  # a sampler whose examples for pre-training fail once the run started
    from metadist.tasks import register_task_sampler
    from metadist.tasks.forecast import ForecastSampler

    @register_task_sampler("labels_fail")
    class LabelsFail(ForecastSampler):
        def labelled_examples(self, units):
            raise ValueError("the labelled examples failed")
before = {k: v for k, v in os.environ.items() if k.startswith("WANDB")}
found = {}
try:
    metadist.fit(
        "synthetic_maml",
        [f"data.store={store}", "trainer.meta_steps=2", "trainer.meta_batch_size=2",
         "trainer.eval_every=0", "logging.progress=false", "logging.wandb.mode=offline",
         *(["pretrain.steps=5", "sampler.name=labels_fail"] if case == "fails" else [])],
        run_dir=run_dir, evaluate=False,
    )
except ValueError as error:
    if case != "fails":
        raise
    found["error"] = str(error)
    found["open_run"] = wandb.run is not None
after = {k: v for k, v in os.environ.items() if k.startswith("WANDB")}
print("USER CODE", file=sys.stderr, flush=True)
found.update(env_before=before, env_after=after)
if case == "set-up":
    found["setup_mode"] = wandb.setup().settings.mode
elif case == "active":
    found["still_current"] = wandb.run is mine
    try:
        mine.log({"after": 1.0})  # wandb refuses a finished run's records
        found["still_open"] = True
    except wandb.errors.UsageError:
        found["still_open"] = False
    mine.finish()
elif case == "fresh":
    # the user's own runs: one with WANDB_MODE=disabled (wandb reads the environment when
    # it is first set up), then one offline (is it quiet?)
    os.environ["WANDB_MODE"] = "disabled"
    run = wandb.init(project="mine", dir=user_dir)
    found["user_disabled"] = bool(run.disabled)
    run.finish()
    run = wandb.init(project="mine", dir=user_dir, mode="offline")
    found["user_silent"] = bool(run.settings.silent)
    run.finish()
print("FOUND " + json.dumps(found))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tiny_store(tmp_path_factory.mktemp("wandb_state"), num_entities=12, seed=4)


def _fit(store, tmp_path, case: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-c", SCRIPT, str(store.path), str(tmp_path / "run")]
    argv += [str(tmp_path / "user"), case]
    (tmp_path / "user").mkdir()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("FOUND "))
    # the training's wandb run was started, offline, in the run directory
    assert (tmp_path / "run" / "wandb" / "debug.log").exists(), done.stderr[-3000:]
    return json.loads(line.removeprefix("FOUND ")), done.stderr


def test_the_users_next_wandb_run_starts_from_its_own_settings(store, tmp_path):
    found, output = _fit(store, tmp_path, "fresh")
    assert found["env_after"] == found["env_before"]  # no WANDB_SILENT, no WANDB_SERVICE
    assert found["user_silent"] is False  # logging.wandb.quiet was the training's only
    assert found["user_disabled"] is True  # not the training's offline mode
    # the training itself kept wandb's console output out of the way (quiet, the default)
    training = output.split("USER CODE")[0]
    assert "wandb:" not in training, training[-3000:]


@pytest.mark.slow  # the same path runs in the suite's other tests; this one costs seconds
def test_a_wandb_the_user_set_up_is_left_as_it_was(store, tmp_path):
    found, _ = _fit(store, tmp_path, "set-up")
    # the service the run started is the user's setup's (`wandb.teardown` ends both)
    found["env_after"].pop("WANDB_SERVICE", None)
    assert found["env_after"] == found["env_before"]
    assert found["setup_mode"] == "disabled"


def test_a_training_stopped_by_an_error_leaves_no_wandb_run_open(store, tmp_path):
    found, _ = _fit(store, tmp_path, "fails")
    assert found["error"] == "the labelled examples failed"
    assert found["open_run"] is False
    assert found["env_after"] == found["env_before"]  # its wandb setup torn down too


@pytest.mark.slow  # the same path runs in the suite's other tests; this one costs seconds
def test_a_run_the_user_has_open_goes_on(store, tmp_path):
    found, _ = _fit(store, tmp_path, "active")
    assert found["still_open"] is True  # the training's run was not finished in its place
    assert found["still_current"] is True
