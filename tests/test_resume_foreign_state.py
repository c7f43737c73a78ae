"""A run directory whose latest checkpoint was written with `save_checkpoint` by other
code (the run's learner and config, no optimizer or loader state): one `CheckpointError`
naming the file and what it lacks, not a `KeyError` from deep in the resume."""

from __future__ import annotations

import pytest
from test_train_loop import tiny_config

from metadist.train import CheckpointError, latest_checkpoint_state, save_checkpoint, train


def test_a_checkpoint_without_training_state_is_refused_by_name(tmp_path):
    run_dir = tmp_path / "run"
    train(tiny_config(run_dir, "trainer.meta_steps=2"))
    state = latest_checkpoint_state(run_dir)
    kept = {key: state[key] for key in ("learner", "config", "run_id")}
    path = save_checkpoint(run_dir, 3, kept)  # as a script of the user's might
    with pytest.raises(CheckpointError) as refused:
        train(tiny_config(run_dir, "trainer.meta_steps=8"))
    assert str(refused.value) == (
        f"checkpoint {path} holds no training state to resume (optimizer, loader missing): "
        "move it away, or use another run_dir"
    )
