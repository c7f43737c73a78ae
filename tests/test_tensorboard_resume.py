"""A resumed run's TensorBoard scalars continue the run's without a step shown twice: the
events an interrupted attempt wrote after its last checkpoint are purged, as its
`metrics.jsonl` lines are (real trainings, read back with TensorBoard's own reader); a
finished run run again opens no new TensorBoard file or wandb run."""

from __future__ import annotations

import shutil

import pytest

from metadist.train.logging import read_metrics
from tests.tiny_runs import tiny_store, train_tiny

pytest.importorskip("tensorboard")


def _scalars(run_dir, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_resume_after_an_interruption_shows_each_step_once(tmp_path):
    store = tiny_store(tmp_path, num_entities=12, seed=5)
    run_dir = tmp_path / "run"
    settings = [
        "experiment=synthetic_maml",
        "trainer.meta_steps=4",
        "trainer.checkpoint_every=2",
        "logging.log_every=1",
        "logging.tensorboard=true",
    ]
    train_tiny(store, run_dir, *settings)
    # interrupted after step 4 was logged but before its checkpoint was written
    (run_dir / "checkpoints" / "step_00000004.pt").unlink()
    (run_dir / "checkpoints" / "latest").unlink()
    train_tiny(store, run_dir, *settings)

    losses = [(r["step"], r["loss"]) for r in read_metrics(run_dir) if r["split"] == "train"]
    assert [step for step, _ in losses] == [1, 2, 3, 4]
    board = _scalars(run_dir, "train/loss")
    assert [step for step, _ in board] == [1, 2, 3, 4]
    # the resumed attempt's values, the same as metrics.jsonl's
    assert [value for _, value in board] == pytest.approx([v for _, v in losses], rel=1e-6)


def test_a_run_restarted_before_its_first_checkpoint_shows_each_step_once(tmp_path):
    store = tiny_store(tmp_path, num_entities=12, seed=7)
    run_dir = tmp_path / "run"
    settings = [
        "experiment=synthetic_maml",
        "trainer.meta_steps=3",
        "logging.log_every=1",
        "logging.tensorboard=true",
    ]
    train_tiny(store, run_dir, *settings)
    shutil.rmtree(run_dir / "checkpoints")  # stopped before any checkpoint was written
    train_tiny(store, run_dir, *settings)
    losses = [(r["step"], r["loss"]) for r in read_metrics(run_dir) if r["split"] == "train"]
    board = _scalars(run_dir, "train/loss")
    assert [step for step, _ in board] == [step for step, _ in losses] == [1, 2, 3]
    assert [value for _, value in board] == pytest.approx([v for _, v in losses], rel=1e-6)


def test_a_finished_run_run_again_adds_no_log_session(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline: no connection is opened
    store = tiny_store(tmp_path, num_entities=12, seed=6)
    run_dir = tmp_path / "run"
    settings = [
        "experiment=synthetic_maml",
        "logging.tensorboard=true",
        "logging.wandb.mode=offline",
    ]
    train_tiny(store, run_dir, *settings)
    events = sorted(p.name for p in (run_dir / "tensorboard").iterdir())
    wandb_runs = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(events) == 1 and len(wandb_runs) == 1
    train_tiny(store, run_dir, *settings)  # nothing left to train
    assert sorted(p.name for p in (run_dir / "tensorboard").iterdir()) == events
    assert sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*")) == wandb_runs
