"""Runs that report well: progress lines off a terminal, a default run directory per
component choice, and a word when a resumed run has nothing left to train."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from metadist.train.compose import compose_dict, load_config
from metadist.train.loop import train

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_training_off_a_terminal_prints_progress_lines(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "metadist.cli",
            "train",
            "experiment=sinusoid_maml",
            f"run_dir={tmp_path / 'run'}",
            "trainer.meta_steps=100",
            "trainer.checkpoint_every=100",
            "logging.progress_every=0.05",
            "logging.wandb.mode=disabled",
            "--no-eval",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    assert done.returncode == 0, done.stderr
    lines = [
        line
        for line in done.stderr.splitlines()
        if re.fullmatch(
            r"sinusoid_maml: \d+/100 steps \(\d+%\), \d+ s, about \d+ s left, "
            r"loss [0-9.e+-]+, [\d,]+ tasks/s",
            line,
        )
    ]
    assert lines, done.stderr
    assert "\x1b[" not in done.stderr  # no terminal control codes in a log file


def test_the_default_run_dir_follows_the_chosen_groups():
    assert compose_dict(["experiment=sinusoid_maml"])["run_dir"] == "runs/sinusoid_maml"
    values = compose_dict(["experiment=sinusoid_maml", "learner=metasgd", "model=mlp"])
    assert values["run_dir"] == "runs/sinusoid_maml.learner-metasgd.model-mlp"
    explicit = compose_dict(["experiment=sinusoid_maml", "learner=metasgd", "run_dir=here"])
    assert explicit["run_dir"] == "here"


def test_resuming_a_finished_run_says_there_is_nothing_to_train(tmp_path, capsys):
    common = [
        "experiment=sinusoid_maml",
        f"run_dir={tmp_path / 'run'}",
        "trainer.checkpoint_every=10",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
    ]
    first = train(load_config([*common, "trainer.meta_steps=10"]))
    assert first.step == 10
    capsys.readouterr()
    again = train(load_config([*common, "trainer.meta_steps=5"]))
    assert again.step == 10
    err = capsys.readouterr().err
    assert (
        "already holds 10 meta-steps, not fewer than trainer.meta_steps=5: nothing to train" in err
    )


def test_tensorboard_scalars_next_to_the_metrics_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    config = load_config(
        [
            "experiment=sinusoid_maml",
            f"run_dir={run_dir}",
            "trainer.meta_steps=20",
            "trainer.checkpoint_every=20",
            "logging.log_every=5",
            "logging.tensorboard=true",
            "logging.wandb.mode=disabled",
            "logging.progress=false",
        ]
    )
    train(config)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    steps = [event.step for event in events.Scalars("train/loss")]
    assert steps == [5, 10, 15, 20]
    assert (run_dir / "metrics.jsonl").read_text().count('"split": "train"') == 4
