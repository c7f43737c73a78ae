"""A sampler of one's own that declares itself wrongly is told what to change in one line:
one that leaves `needs_store` at TaskSampler's default but takes no store was told to set
`data.store` (or, given a store, that an option had the wrong type), and one that leaves
an abstract method out was asked whether an option had the wrong type."""

import re
import textwrap

import pytest
from _task_stores import PANEL_LENGTHS, build_encoded_store

from metadist.cli import main
from metadist.tasks import build_task_sampler

MODULE = textwrap.dedent(
    """
    from metadist.tasks import TaskSampler, register_task_sampler
    from metadist.tasks.sinusoid import SinusoidSampler


    @register_task_sampler("usd_no_store_argument")
    class NoStoreArgument(TaskSampler):
        def __init__(self, *, num_tasks: int = 100):
            self.inner = SinusoidSampler(num_tasks=num_tasks)

        @property
        def num_units(self):
            return self.inner.num_units

        def sample(self, units, seeds):
            return self.inner.sample(units, seeds)


    @register_task_sampler("usd_abstract")
    class Abstract(TaskSampler):
        needs_store = False

        def __init__(self, *, num_tasks: int = 100):
            self.num_tasks = num_tasks

        def sample(self, units, seeds):
            return None
    """
)

CASES = {
    "usd_no_store_argument": r"sampler: task sampler 'usd_no_store_argument' \(NoStoreArgument\): "
    r"needs_store is True \(TaskSampler's default\) but its constructor takes no store "
    r"argument: set needs_store = False in the class",
    "usd_abstract": r"sampler: task sampler 'usd_abstract' \(Abstract\) could not be built from "
    r"sampler.options \{'num_tasks': 100\}: Can't instantiate abstract class Abstract "
    r"with abstract method num_units$",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_sampler_declared_wrongly_is_one_line_saying_what_to_change(
    name, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_samplers_usd.py").write_text(MODULE)
    code = main(
        ["train", "experiment=sinusoid_maml", "imports=[my_samplers_usd]", f"sampler.name={name}",
         "sampler.options.num_tasks=100", f"run_dir={tmp_path / 'run'}", "trainer.meta_steps=1",
         "logging.progress=false", "logging.wandb.mode=disabled", "--no-eval"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "option of the wrong type" not in lines[0] and "data.store" not in lines[0]
    assert re.search(CASES[name], lines[0]), lines[0]


def test_a_store_given_to_a_sampler_that_takes_none_is_named_as_such(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_samplers_usd.py").write_text(MODULE)
    __import__("my_samplers_usd")
    store = build_encoded_store(tmp_path, PANEL_LENGTHS)
    with pytest.raises(ValueError) as caught:
        build_task_sampler("usd_no_store_argument", store, num_tasks=10)
    assert str(caught.value).startswith(
        "task sampler 'usd_no_store_argument' (NoStoreArgument): needs_store is True"
    ), caught.value
