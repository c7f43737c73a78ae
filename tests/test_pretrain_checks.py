"""A pre-training phase the run's parts cannot have (`pretrain.steps` on a sampler
without labelled examples) is refused in one line before anything of the run is
written: no config.yaml, inference.json, metrics.jsonl or wandb directory left in a run
directory that then holds nothing trained."""

import pytest

from metadist.cli import main
from tests.tiny_runs import tiny_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tiny_store(tmp_path_factory.mktemp("pretrain_checks"), num_entities=12, seed=3)


def test_pretraining_without_labelled_examples_is_refused_before_any_file(store, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(
        ["train", "experiment=synthetic_maml", f"data.store={store.path}", f"run_dir={run_dir}",
         "pretrain.steps=5", "trainer.meta_steps=2", "trainer.meta_batch_size=2",
         "trainer.eval_every=0", "logging.progress=false", "logging.wandb.mode=offline",
         "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.strip().splitlines()[-1] == (
        "metadist train: error: pretrain.steps=5: sampler 'forecast' gives no labelled "
        "examples (a labelled_examples(units) method, as nway_kshot has); set pretrain.steps=0"
    )
    assert "Traceback" not in err
    assert not run_dir.exists() or list(run_dir.iterdir()) == []
