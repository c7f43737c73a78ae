"""A run whose tasks now have other shapes than its checkpoint was trained on (a sampler
of one's own changed since, or the shapes in its `inference.json` edited): loading it is
one line naming the run and the first weight that differs, not torch's many-line
"Error(s) in loading state_dict" traceback."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from tiny_runs import tiny_store, train_tiny

import metadist
from metadist.cli import main
from metadist.train.artifact import INFERENCE_FILE

pytestmark = pytest.mark.integration

MODULE = textwrap.dedent(
    """
    import os

    import torch

    from metadist.batch import MetaBatch, TaskSet
    from metadist.tasks import register_task_sampler
    from metadist.tasks.sinusoid import SinusoidSampler


    @register_task_sampler("ucf_sampler")
    class Sampler(SinusoidSampler):
        def sample(self, units, seeds):
            batch = super().sample(units, seeds)
            if not os.environ.get("UCF_TWO_INPUTS"):
                return batch
            wide = [TaskSet(torch.cat([s.x, s.x], -1), s.y) for s in (batch.support, batch.query)]
            return MetaBatch(*wide, entity_index=batch.entity_index, stratum=batch.stratum,
                             split_time=batch.split_time)
    """
)


@pytest.mark.timeout(180)
def test_a_users_sampler_changed_since_training_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "ucf_module.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("UCF_TWO_INPUTS", raising=False)
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[ucf_module]", "sampler.name=ucf_sampler",
         "run_dir=run", "trainer.meta_steps=2", "trainer.eval_every=0",
         "logging.progress=false", "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    env = {**os.environ, "UCF_TWO_INPUTS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "eval", "run_dir=run"]
        + ["--allow-import", "ucf_module", "eval.max_tasks=4"],
        capture_output=True, text=True, timeout=150, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "metadist eval: error: run_dir run: its checkpoint's weights do not fit the model "
        "built for its tasks (inputs [2], outputs [1]): size mismatch for "
    ), lines[-1]
    assert lines[-1].endswith("its sampler cuts other windows than in training (a sampler "
                              "of your own changed since, or the run's record of its shapes "
                              "was edited)")  # fmt: skip


def test_edited_shapes_in_the_record_are_one_line(tmp_path, monkeypatch):
    store = tiny_store(tmp_path, num_entities=12, seed=3)
    train_tiny(store, tmp_path / "run", "experiment=synthetic_maml")
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(tmp_path / "run", moved)
    shutil.rmtree(tmp_path / "store")
    record = json.loads((moved / INFERENCE_FILE).read_text())
    record["shapes"]["input_shape"][-1] += 2
    (moved / INFERENCE_FILE).write_text(json.dumps(record))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as raised:
        metadist.load_run(moved)
    message = str(raised.value)
    assert message.startswith(
        f"run_dir {moved}: its checkpoint's weights do not fit the model built for its tasks "
        f"(inputs {record['shapes']['input_shape']}"
    )
    assert "size mismatch for " in message and "\n" not in message
