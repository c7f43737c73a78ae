"""A registering decorator written without its name (`@register_task_sampler` for
`@register_task_sampler("mine")`) registered nothing and replaced the class by the
decorator, so a run said the sampler was unknown and told the user to import the module
they had imported; an empty name was registered as "". Both are refused where the
decorator is written."""

import textwrap

import pytest
from torch import nn

from metadist.cli import main
from metadist.learners import register_learner
from metadist.learners.maml import MAML
from metadist.models import register_model
from metadist.tasks import register_task_sampler, registered_task_samplers
from metadist.tasks.sinusoid import SinusoidSampler
from metadist.train.optim import register_optimizer


@pytest.mark.parametrize(
    ("decorator", "name", "cls"),
    [
        (register_task_sampler, "register_task_sampler", SinusoidSampler),
        (register_model, "register_model", nn.Linear),
        (register_learner, "register_learner", MAML),
        (register_optimizer, "register_optimizer", len),
    ],
)
def test_a_decorator_without_its_name_is_refused(decorator, name, cls):
    with pytest.raises(TypeError) as caught:
        decorator(cls)
    assert str(caught.value) == (
        f"@{name} needs the name to register {cls.__name__} under: write "
        f'@{name}("my_name"), not @{name} alone'
    )
    with pytest.raises(ValueError, match=rf'^@{name}\(" "\): the name is empty$'):
        decorator(" ")


def test_a_sampler_module_with_a_bare_decorator_stops_the_run_in_one_line(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_bare_sampler.py").write_text(
        textwrap.dedent(
            """
            from metadist.tasks import register_task_sampler
            from metadist.tasks.sinusoid import SinusoidSampler


            @register_task_sampler
            class Bare(SinusoidSampler):
                pass
            """
        )
    )
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[my_bare_sampler]", "sampler.name=Bare",
         f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=1", "logging.progress=false",
         "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "@register_task_sampler needs the name to register Bare under" in lines[0]
    assert "my_bare_sampler.py:6" in lines[0], lines[0]
    assert "" not in registered_task_samplers()
