"""An `eval.ensemble` member must hold out the evaluated split: a run trained with
another seed deals other entities to meta-train, the evaluated run's meta-test ones
among them, and its forecasts of them have seen their truth."""

import numpy as np
import pytest

from metadist.datasets import SYNTHETIC_INGEST_ARGS, write_synthetic_panel
from metadist.eval import evaluate_run
from metadist.store import ingest
from metadist.train.__main__ import main


def test_a_member_trained_on_the_evaluated_entities_is_refused(tmp_path, capsys):
    panel = write_synthetic_panel(
        tmp_path / "panel", num_entities=40, length_range=(90, 120), seed=3, num_files=1
    )
    ingest(
        panel.out_dir, tmp_path / "store", **{**SYNTHETIC_INGEST_ARGS, "nan": "ffill"},
        progress=False,
    )  # fmt: skip
    common = [
        "experiment=synthetic_maml",
        f"data.store={tmp_path / 'store'}",
        "trainer.meta_steps=2",
        "trainer.meta_batch_size=4",
        "trainer.eval_every=0",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        "--no-eval",
    ]
    members = {
        "a": ["trainer.seed=1"],
        "other_seed": ["trainer.seed=2"],  # another partition of the entities
        "same_split": ["trainer.seed=1", "learner.options.inner_lr=0.02"],
    }
    for name, extra in members.items():
        assert main([*common, f"run_dir={tmp_path / name}", *extra]) == 0
    overrides = ["eval.max_tasks=4", "eval.scratch_steps=0"]
    with pytest.raises(ValueError, match=r"other_seed trained on .* entities of the evaluated"):
        evaluate_run(
            tmp_path / "a",
            overrides=[*overrides, f"eval.ensemble=[{tmp_path / 'other_seed'}]"],
            write=False,
        )
    both = evaluate_run(
        tmp_path / "a",
        overrides=[*overrides, f"eval.ensemble=[{tmp_path / 'same_split'}]"],
        write=False,
    )
    assert str(tmp_path / "same_split") in both["settings"]["ensemble"]
    assert np.isfinite(both["overall"]["adapted"]["smape"]["value"])
    # every unit evaluated (a holdout's protocol): nothing is held out, any member joins
    every = evaluate_run(
        tmp_path / "a",
        overrides=[*overrides, "eval.split=all", f"eval.ensemble=[{tmp_path / 'other_seed'}]"],
        write=False,
    )
    assert str(tmp_path / "other_seed") in every["settings"]["ensemble"]
