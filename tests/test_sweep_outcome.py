"""How a sweep judges a trial whose training exited: completed (all its meta-steps, or
stopped early by `selection.patience`) or failed, and why."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from metadist.cli import main as cli_main
from metadist.launch.sweep import read_val_metric

TINY = [
    "experiment=sinusoid_maml",
    "trainer.meta_batch_size=4",
    "trainer.eval_batches=1",
    "trainer.checkpoint_every=100000",
    "learner.options.eval_inner_steps=1",
    "model.options.hidden_sizes=[8]",
    "sampler.options.num_tasks=200",
    "logging.wandb.mode=disabled",
    "trainer.meta_steps=40",
    "trainer.eval_every=2",
]
SPACE = "optimizer.lr: {type: float, low: 1e-4, high: 1e-2, log: true}\n"


def _sweep(tmp_path: Path, *extra: str, space: str = SPACE) -> list[str]:
    (tmp_path / "space.yaml").write_text(space)
    return [
        "sweep",
        *TINY,
        *extra,
        f"--space={tmp_path / 'space.yaml'}",
        f"--sweep-dir={tmp_path / 'sweep'}",
        "--poll-seconds=0.2",
        "--pruner=none",
    ]


def _study(sweep_dir: Path) -> optuna.Study:
    return optuna.load_study(study_name="metadist-sweep", storage=f"sqlite:///{sweep_dir}/study.db")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_trial_stopped_early_by_its_patience_completes(tmp_path, capsys):
    # no evaluation improves on the first by 1000: patience 1 stops every run at step 4
    argv = _sweep(tmp_path, "selection.patience=1", "selection.min_delta=1000", "--trials=1")
    assert cli_main(argv) == 0, capsys.readouterr().err
    sweep_dir = tmp_path / "sweep"
    (trial,) = _study(sweep_dir).get_trials()
    assert trial.state == optuna.trial.TrialState.COMPLETE
    run_dir = Path(trial.user_attrs["run_dir"])
    assert "early stop at step 4" in (run_dir / "train.log").read_text()
    # its score is its last meta-val value, as for a trial that trains all its steps
    assert read_val_metric(run_dir, "loss")[-1] == (4, trial.value)
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["trial"] == 0 and best["value"] == trial.value

    # its rerun stops early at the same step, with the same value
    assert cli_main(["sweep", f"--sweep-dir={sweep_dir}", "--rerun=0", "--poll-seconds=0.2"]) == 0
    assert "trial 0 reproduced exactly" in capsys.readouterr().out


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_failed_trial_is_named_by_the_trainings_own_error(tmp_path, capsys):
    """A trial whose meta-loss is not finite fails with the training's line saying so,
    not a bare exit status to look up in its log."""
    huge = (
        "optimizer.lr: {type: float, low: 1.0e+3, high: 1.0e+5, log: true}\n"
        "learner.options.inner_lr: {type: float, low: 1.0e+3, high: 1.0e+5, log: true}\n"
    )
    argv = _sweep(tmp_path, "--trials=1", "--max-failures=1", space=huge)
    assert cli_main(argv) == 1
    captured = capsys.readouterr()
    said = "exit status 1: the meta-loss is not finite at step 1"
    assert f"trial 0 failed: {said}" in captured.out
    (line,) = captured.err.strip().splitlines()
    assert f"1 trials failed: trial 0 ({said}" in line and "train.log)" in line, line
    (trial,) = _study(tmp_path / "sweep").get_trials()
    assert trial.state == optuna.trial.TrialState.FAIL
    # trials.md says it too, in the failed trial's row
    (row,) = [
        r for r in (tmp_path / "sweep" / "trials.md").read_text().splitlines() if "| 0 |" in r
    ]
    assert "| fail |" in row and f"| {said}" in row, row
