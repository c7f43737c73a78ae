"""A sampler of one's own whose dtype depends on its units (padding short series with
`np.zeros`, which is float64) passes the first batch's check and gave a later batch the
models cannot take: the run stopped with a traceback from deep in the model (`mat1 and
mat2 must have the same dtype`). Every batch's dtypes are checked: one line naming the
sampler and the step."""

import textwrap

from metadist.cli import main

MODULE = textwrap.dedent(
    """
    import numpy as np
    import torch

    from metadist.batch import MetaBatch, TaskSet
    from metadist.tasks import register_task_sampler
    from metadist.tasks.sinusoid import SinusoidSampler


    @register_task_sampler("usl_padded")
    class Padded(SinusoidSampler):
        def sample(self, units, seeds):
            batch = super().sample(units, seeds)
            x = batch.support.x.numpy()
            if (units != 0).any():  # "short" units padded with np.zeros: float64
                x = np.concatenate([np.zeros((len(units), 0, 1)), x], axis=1)
            support = TaskSet(torch.from_numpy(x), batch.support.y)
            return MetaBatch(support=support, query=batch.query,
                             entity_index=batch.entity_index, stratum=batch.stratum,
                             split_time=batch.split_time)
    """
)


def test_a_later_batch_of_another_dtype_is_one_line_naming_the_step(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_samplers_usl.py").write_text(MODULE)
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[my_samplers_usl]",
         "sampler.name=usl_padded", f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=2",
         "logging.progress=false", "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "metadist train: error: sampler 'usl_padded': sample() at meta-step 1: support.x is "
        "torch.float64; the models take torch.float32"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()
