"""A resumed run continues the same wandb run: each attempt's offline wandb run (real
wandb, offline) has the run id kept in the run's checkpoints."""

from __future__ import annotations

import json

from tests.tiny_runs import tiny_store, train_tiny


def test_a_resumed_run_logs_to_the_same_wandb_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the suite's default (disabled) would win
    store = tiny_store(tmp_path, num_entities=12, seed=8)
    run_dir = tmp_path / "run"
    settings = ["experiment=synthetic_maml", "logging.wandb.mode=offline"]
    train_tiny(store, run_dir, *settings)
    train_tiny(store, run_dir, *settings, "trainer.meta_steps=4")  # resumed from step 2
    run_id = json.loads((run_dir / "checkpoints" / "run.json").read_text())["run_id"]
    # one directory per attempt (`offline-run-<start time>-<id>`; the same one were both
    # started within a second)
    attempts = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert attempts and {path.name.rpartition("-")[2] for path in attempts} == {run_id}
