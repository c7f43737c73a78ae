"""A sampler of one's own whose `confined_to` forgets its `return` (it gives None) stopped
training with `AttributeError: 'NoneType' object has no attribute 'sample'` and a traceback;
the loader and the evaluation protocol check what it returns and say so in one line."""

import textwrap

import numpy as np
import pytest

from metadist.cli import main

MODULE = textwrap.dedent(
    """
    from metadist.tasks import register_task_sampler
    from metadist.tasks.sinusoid import SinusoidSampler


    @register_task_sampler("usc_no_return")
    class NoReturn(SinusoidSampler):
        draws_across_units = True

        def confined_to(self, units):
            self.units = units
    """
)

WRONG = (
    "sampler 'usc_no_return' (NoReturn): confined_to(units) returned NoneType, not a "
    "TaskSampler; to fix: return the sampler confined to the units (a copy, or self)"
)


def test_a_confined_to_that_returns_nothing_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_samplers_usc.py").write_text(MODULE)
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[my_samplers_usc]",
         "sampler.name=usc_no_return", f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=1",
         "logging.progress=false", "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].endswith(WRONG), lines[0]

    from my_samplers_usc import NoReturn

    with pytest.raises(ValueError) as caught:
        NoReturn(num_tasks=10).for_evaluation(np.arange(5))
    assert str(caught.value) == WRONG
