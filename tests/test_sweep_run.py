"""`metadist sweep` end to end: real training runs as trials, on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from metadist.launch.sweep import (
    ParamSpec,
    SweepSettings,
    enqueue_trial,
    open_study,
    read_val_metric,
    run_sweep,
)

REPO = Path(__file__).resolve().parents[1]

TOY_OVERRIDES = [
    "experiment=synthetic_maml",
    "trainer.meta_steps=12",
    "trainer.meta_batch_size=4",
    "trainer.eval_every=4",
    "trainer.eval_batches=1",
    "trainer.checkpoint_every=12",
    "learner.options.eval_inner_steps=1",
    "logging.wandb.mode=disabled",
]
SPACE = """\
learner.options.inner_lr: {type: float, low: 1e-3, high: 1e-1, log: true}
optimizer.lr: {type: float, low: 1e-4, high: 1e-2, log: true}
"""


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory) -> Path:
    from metadist.datasets import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
    from metadist.store import ingest

    root = tmp_path_factory.mktemp("toy")
    panel = write_synthetic_panel(
        root / "panel", num_entities=60, length_range=(90, 140), seed=3, num_files=2
    )
    ingest(panel.out_dir, root / "store", **SYNTHETIC_INGEST_ARGS, progress=False)
    return root / "store"


def _metadist(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "metadist.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.slow  # 60-75 s; the sweep's processes are also driven by the tests below
@pytest.mark.integration
@pytest.mark.timeout(400)
def test_three_trial_sweep_two_at_a_time_on_a_toy_store(toy_store, tmp_path):
    sweep_dir = tmp_path / "sweep"
    (tmp_path / "space.yaml").write_text(SPACE)
    finished = _metadist(
        "sweep",
        *TOY_OVERRIDES,
        f"data.store={toy_store}",
        "--trials=3",
        f"--space={tmp_path / 'space.yaml'}",
        f"--sweep-dir={sweep_dir}",
        "--parallel=2",
        "--pruner=none",
        "--poll-seconds=0.2",
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr

    study = optuna.load_study(
        study_name="metadist-sweep", storage=f"sqlite:///{sweep_dir}/study.db"
    )
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert sorted(t.user_attrs["seed"] for t in trials) == [0, 1, 2]

    # Every trial's value is the last meta-val metric its run wrote.
    for t in trials:
        run_dir = Path(t.user_attrs["run_dir"])
        assert run_dir.parent == sweep_dir / "trials"
        assert read_val_metric(run_dir, "loss")[-1] == (12, t.value)

    # Own seed, own meta-train/val split; the same pinned meta-test split everywhere.
    splits = {
        t.number: json.loads((sweep_dir / "trials" / f"{t.number:04d}" / "split.json").read_text())
        for t in trials
    }
    for number, split in splits.items():
        units = split["train"] + split["val"] + split["test"]
        assert len(units) == len(set(units)) == 60
        config = yaml.safe_load(
            (sweep_dir / "trials" / f"{number:04d}" / "config.yaml").read_text()
        )
        assert config["trainer"]["seed"] == split["seed"]
        assert config["data"]["pinned_test_units"] == split["test"]
    assert splits[0]["train"] != splits[1]["train"]
    assert all(split["test"] == splits[0]["test"] for split in splits.values())

    # The reports: the best configuration and a table with every trial.
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    winner = min(trials, key=lambda t: t.value)
    assert best["trial"] == winner.number and best["value"] == winner.value
    assert best["params"] == winner.params
    assert f"trainer.seed={winner.user_attrs['seed']}" in best["overrides"]
    # the trial's own overrides, its pinned meta-test split included: they reproduce it
    pins = "data.pinned_test_units=[" + ",".join(map(str, splits[winner.number]["test"])) + "]"
    assert pins in best["overrides"] and "--no-eval" not in best["overrides"]
    assert not any(o.startswith(("run_dir=", "logging.progress=")) for o in best["overrides"])
    table = (sweep_dir / "trials.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "complete" in line]
    assert len(rows) == 3

    # A rerun of a trial with its seed reproduces its metric exactly.
    rerun = _metadist("sweep", f"--sweep-dir={sweep_dir}", "--rerun=1", "--poll-seconds=0.2")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "trial 1 reproduced exactly" in rerun.stdout
    (rerun_dir,) = (sweep_dir / "reruns").iterdir()
    assert read_val_metric(rerun_dir, "loss")[-1] == (12, trials[1].value)

    # Running the same sweep again finds it finished and adds nothing.
    again = _metadist(
        "sweep",
        *TOY_OVERRIDES,
        f"data.store={toy_store}",
        "--trials=3",
        f"--space={tmp_path / 'space.yaml'}",
        f"--sweep-dir={sweep_dir}",
    )
    assert again.returncode == 0, again.stderr
    assert (
        len(
            optuna.load_study(
                study_name="metadist-sweep", storage=f"sqlite:///{sweep_dir}/study.db"
            ).trials
        )
        == 3
    )


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_poor_trial_is_pruned_and_its_processes_stopped(tmp_path):
    space = [
        ParamSpec(
            "+sampler.options.amplitude_range", "categorical", choices=([0.1, 5.0], [300.0, 500.0])
        ),
        ParamSpec("trainer.meta_steps", "categorical", choices=(8, 100000)),
    ]
    settings = SweepSettings(
        overrides=[
            "experiment=sinusoid_maml",
            "trainer.meta_batch_size=4",
            "trainer.eval_every=2",
            "trainer.eval_batches=1",
            "trainer.checkpoint_every=1000",
            "learner.options.eval_inner_steps=1",
            "sampler.options.num_tasks=200",
            "logging.wandb.mode=disabled",
        ],
        space=space,
        sweep_dir=tmp_path / "sweep",
        num_trials=2,
        startup_trials=1,
        poll_seconds=0.2,
    )
    # A good short trial first, then one whose targets are a hundred times larger.
    enqueue_trial(settings, {space[0].name: [0.1, 5.0], space[1].name: 8})
    enqueue_trial(settings, {space[0].name: [300.0, 500.0], space[1].name: 100000})
    messages: list[str] = []
    run_sweep(settings, log=messages.append)

    study = open_study(settings)
    good, poor = study.get_trials()
    assert good.state == optuna.trial.TrialState.COMPLETE
    assert poor.state == optuna.trial.TrialState.PRUNED, messages
    assert any(m.startswith("trial 1 pruned at step") for m in messages)
    # The pruned run was told to stop: it checkpointed on SIGTERM long before its 100000
    # steps (run_sweep waited for its processes to exit).
    log = (tmp_path / "sweep" / "trials" / "0001" / "train.log").read_text()
    assert "SIGTERM: checkpoint of step" in log, log
    pointer = json.loads(
        (tmp_path / "sweep" / "trials" / "0001" / "checkpoints" / "latest").read_text()
    )
    assert 2 <= pointer["step"] < 1000
    table = (tmp_path / "sweep" / "trials.md").read_text()
    assert "| 1 | pruned | 1 | [300.0, 500.0] | 100000 |" in table
    assert "| last val step | seconds |" in table.splitlines()[4]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("presses", [1, 2])
def test_an_interrupted_sweep_runs_the_cut_off_trial_again(tmp_path, presses):
    import signal
    import time

    sweep_dir = tmp_path / "sweep"
    (tmp_path / "space.yaml").write_text(
        "optimizer.lr: {type: float, low: 1e-4, high: 1e-2, log: true}\n"
    )
    command = [
        sys.executable,
        "-m",
        "metadist.cli",
        "sweep",
        "experiment=sinusoid_maml",
        "trainer.meta_steps=20",
        "trainer.meta_batch_size=4",
        "trainer.eval_every=10",
        "trainer.eval_batches=1",
        "trainer.checkpoint_every=1000",
        "learner.options.eval_inner_steps=1",
        "sampler.options.num_tasks=200",
        "logging.wandb.mode=disabled",
        "--trials=1",
        f"--space={tmp_path / 'space.yaml'}",
        f"--sweep-dir={sweep_dir}",
        "--poll-seconds=0.2",
    ]
    driver = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as at a terminal, also where the tests run in the background (SIGINT
        # ignored, which a child would inherit)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Interrupt the sweep while its trial is starting (its log is opened just before the
    # training process starts, which then takes seconds to import torch).
    log = sweep_dir / "trials" / "0000" / "train.log"
    deadline = time.monotonic() + 120
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if presses == 2:  # pressed again while the training checkpoints and stops
        metrics = log.parent / "metrics.jsonl"
        while not metrics.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    driver.send_signal(signal.SIGINT)
    if presses == 2:  # the requeue still completes (it was cut short, the trial left running)
        time.sleep(0.1)
        driver.send_signal(signal.SIGINT)
    output, _ = driver.communicate(timeout=60)
    # (a second press that lands after the requeue, as the interpreter exits, ends it
    # by the signal itself)
    assert driver.returncode in ((130,) if presses == 1 else (130, -signal.SIGINT)), output
    assert "trial 0 stopped; it runs again when the sweep is continued" in output

    storage = f"sqlite:///{sweep_dir}/study.db"
    cut, queued = optuna.load_study(study_name="metadist-sweep", storage=storage).get_trials()
    assert cut.state == optuna.trial.TrialState.FAIL
    assert queued.state == optuna.trial.TrialState.WAITING
    assert queued.user_attrs["seed"] == cut.user_attrs["seed"] == 0

    continued = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert continued.returncode == 0, continued.stdout + continued.stderr
    trials = optuna.load_study(study_name="metadist-sweep", storage=storage).get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].params == cut.params and trials[1].user_attrs["seed"] == 0
