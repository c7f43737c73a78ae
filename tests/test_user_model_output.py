"""A model of one's own whose forward returns something a learner cannot train on (a
tuple, a numpy array, an integer tensor, another shape than it was built for), raises,
or has nothing trainable: `metadist train` stops in one line naming the model, before a
checkpoint is written (it was a traceback from a learner's loss or the optimizer)."""

import re
import textwrap

import pytest

from metadist.cli import main

MODULE = textwrap.dedent(
    """
    import os

    import torch

    from metadist.models import register_model
    from metadist.models.mlp import MLP


    @register_model("umo_model")
    class OwnModel(MLP):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if os.environ.get("UMO_BREAK") == "frozen":
                for parameter in self.parameters():
                    parameter.requires_grad_(False)

        def forward(self, x):
            y = super().forward(x)
            broken = os.environ.get("UMO_BREAK")
            if broken == "tuple":
                return y, None
            if broken == "numpy":
                return y.detach().numpy()
            if broken == "integer":
                return y.long()
            if broken == "shape":
                return y[..., None].expand(*y.shape, 2)
            if broken == "raises":
                return y @ torch.ones(3, 3)
            return y
    """
)


@pytest.fixture(scope="module")
def components(tmp_path_factory):
    path = tmp_path_factory.mktemp("user_model") / "umo_components.py"
    path.write_text(MODULE)
    return path


def train(tmp_path):
    return main(
        ["train", "experiment=sinusoid_maml", "imports=[umo_components]",
         "model.name=umo_model", f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=2",
         "trainer.eval_every=0", "logging.progress=false", "logging.wandb.mode=disabled",
         "--no-eval"]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("tuple", r"forward returned a value of type tuple, not a tensor; it must return one tensor "
                  r"\[\d+, 1\] for inputs \[\d+, 1\]"),
        ("numpy", r"forward returned a value of type ndarray, not a tensor; .*"),
        ("integer", r"forward returned a tensor of torch.int64; the learners need a "
                    r"floating-point output"),
        ("shape", r"forward of inputs \[\d+, 1\] returned \[\d+, 1, 2\]; it must return "
                  r"\[\d+, 1\]"),
        ("raises", r"forward failed on one task's support inputs \[\d+, 1\]: RuntimeError: "
                   r".*\(at .*umo_components.py:\d+\)"),
        ("frozen", r"nothing to meta-train: all \d+ of its parameter tensors have "
                   r"requires_grad=False"),
    ],
)  # fmt: skip
def test_a_model_whose_output_cannot_be_trained_on_is_one_line_naming_it(
    broken, message, components, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(components.parent))
    monkeypatch.setenv("UMO_BREAK", broken)
    code = train(tmp_path)
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.match(
        rf"metadist train: error: model 'umo_model' \(OwnModel\): {message}", lines[0]
    ), lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_same_model_returning_its_tensor_trains(components, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(components.parent))
    monkeypatch.delenv("UMO_BREAK", raising=False)
    assert train(tmp_path) == 0, capsys.readouterr().err
    assert list((tmp_path / "run" / "checkpoints").glob("step_*.pt"))
