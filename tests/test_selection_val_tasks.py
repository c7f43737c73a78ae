"""A run resumed with another meta-val set (`trainer.eval_batches`,
`trainer.meta_batch_size`) does not compare its evaluations with the best of the old one."""

from __future__ import annotations

from test_train_loop import tiny_config

from metadist.train import latest_checkpoint_state, train
from metadist.train.logging import read_metrics

# 80 tasks: 8 of meta-val, two batches of 4; selecting the largest val loss makes the
# first evaluation the best and, as the loss falls, no later one of the same tasks.
SCHEDULE = [
    "sampler.options.num_tasks=80",
    "selection.mode=max",
    "trainer.eval_every=2",
    "trainer.checkpoint_every=100",
]


def test_a_resume_on_fewer_meta_val_tasks_forgets_the_best_and_says_so(tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = train(tiny_config(run_dir, *SCHEDULE, "trainer.meta_steps=4"))
    assert first.step == 4
    before = latest_checkpoint_state(run_dir)["selection"]
    assert before["best_step"] == 2 and before["val_tasks"] == 8
    capsys.readouterr()

    resumed = tiny_config(run_dir, *SCHEDULE, "trainer.meta_steps=6", "trainer.eval_batches=1")
    assert train(resumed).step == 6
    err = capsys.readouterr().err
    assert "over 8 meta-val tasks, this command evaluates 4" in err
    assert "the best so far is forgotten" in err
    after = latest_checkpoint_state(run_dir)["selection"]
    # the first evaluation on the new tasks is the best of the new record
    assert (after["best_step"], after["val_tasks"], after["bad_evals"]) == (6, 4, 0)
    val = [r for r in read_metrics(run_dir) if r["split"] == "val"]
    assert [r["step"] for r in val] == [2, 4, 6]


def test_a_resume_on_the_same_meta_val_tasks_keeps_the_best(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(tiny_config(run_dir, *SCHEDULE, "trainer.meta_steps=4"))
    capsys.readouterr()
    # 4 batches asked, 2 exist: the same 8 tasks
    train(tiny_config(run_dir, *SCHEDULE, "trainer.meta_steps=6", "trainer.eval_batches=4"))
    assert "forgotten" not in capsys.readouterr().err
    after = latest_checkpoint_state(run_dir)["selection"]
    assert (after["best_step"], after["val_tasks"], after["bad_evals"]) == (2, 8, 2)
