"""A run is re-scored with the evaluation settings it recorded, wherever it is evaluated
from; a run that recorded none says which settings it is evaluated with."""

from metadist.eval import evaluate_run
from metadist.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from metadist.train.compose import find_experiments_dir, load_config
from metadist.train.loop import train

RUN = [
    "experiment=sinusoid_maml",
    "trainer.meta_steps=2",
    "trainer.meta_batch_size=4",
    "trainer.checkpoint_every=2",
    "logging.wandb.mode=disabled",
    "logging.progress=false",
]


def test_a_run_without_recorded_settings_says_which_it_uses(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    train(load_config([*RUN, f"run_dir={run_dir}", "eval.max_tasks=3", "eval.scratch_steps=0"]))
    monkeypatch.chdir(tmp_path)  # no ./experiments here: the recorded settings are used
    result = evaluate_run(run_dir, write=False, progress=False)
    assert result["num_tasks"] == 3
    assert "records no evaluation settings" not in capsys.readouterr().err

    # a run saved before runs kept their evaluation settings
    path, pointer = latest_checkpoint(run_dir)
    state = load_checkpoint(path, pointer)
    del state["config"]["eval"]
    save_checkpoint(run_dir, 3, state)
    (run_dir / "checkpoints" / "best").unlink()  # nor a best checkpoint on meta-val
    result = evaluate_run(
        run_dir, overrides=["eval.max_tasks=2", "eval.scratch_steps=0"], write=False, progress=False
    )
    assert result["num_tasks"] == 2
    shipped = find_experiments_dir() / "eval" / "sinusoid_maml.yaml"
    err = capsys.readouterr().err
    assert (
        f"note: run_dir {run_dir} records no evaluation settings (trained before runs kept "
        f"them); using {shipped}"
    ) in err
