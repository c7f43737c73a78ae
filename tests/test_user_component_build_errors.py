"""A sampler or model of one's own whose constructor fails, with any error type: the
training, and a trained run loaded again (`metadist eval`, `load_run`), stop in one line
naming the error and the file and line in the user's code (an `AttributeError` or
`KeyError` there was a traceback; a `ValueError` named no place). So does one its
`unit_strata` raises when the run is split, or its `confined_to` when the loaders are
built."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from metadist.cli import main

MODULE = textwrap.dedent(
    """
    import os

    from metadist.models import register_model
    from metadist.models.mlp import MLP
    from metadist.tasks import register_task_sampler
    from metadist.tasks.sinusoid import SinusoidSampler


    @register_task_sampler("ucb_sampler")
    class Sampler(SinusoidSampler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if os.environ.get("UCB_BREAK") == "attribute":
                self.amplitude = self.amplitude_table
            if os.environ.get("UCB_BREAK") == "value":
                raise ValueError("no amplitudes given")

        draws_across_units = True

        def unit_strata(self):
            if os.environ.get("UCB_BREAK") == "strata":
                return self.strata_table
            return super().unit_strata()

        def confined_to(self, units):
            if os.environ.get("UCB_BREAK") == "confined":
                units.unit_list()
            return self


    @register_model("ucb_model")
    class Model(MLP):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if os.environ.get("UCB_BREAK") == "model":
                {}["hidden"]
    """
)
RAISING = {
    "attribute": "self.amplitude = self.amplitude_table",
    "value": 'raise ValueError("no amplitudes given")',
    "model": '{}["hidden"]',
    "confined": "units.unit_list()",
    "strata": "return self.strata_table",
}
LINES = {  # the line of MODULE that raises each
    broken: next(n for n, line in enumerate(MODULE.splitlines(), 1) if line.strip() == code)
    for broken, code in RAISING.items()
}


@pytest.fixture(scope="module")
def components(tmp_path_factory):
    """The user's module, in one place for every test (it is imported once)."""
    path = tmp_path_factory.mktemp("user_code") / "ucb_components.py"
    path.write_text(MODULE)
    return path


def train(tmp_path, *extra):
    return main(
        ["train", "experiment=sinusoid_maml", "imports=[ucb_components]",
         "sampler.name=ucb_sampler", "model.name=ucb_model", f"run_dir={tmp_path / 'run'}",
         "trainer.meta_steps=2", "trainer.eval_every=0", "logging.progress=false",
         "logging.wandb.mode=disabled", "--no-eval", *extra]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("attribute", r"sampler: AttributeError: 'Sampler' object has no attribute "
                      r"'amplitude_table'"),
        ("value", r"sampler: no amplitudes given"),
        ("model", r"model: KeyError: 'hidden'"),
        # the loader's split (no hint to change the batch size: no setting is at fault)
        ("confined", r"sampler: AttributeError: 'numpy.ndarray' object has no attribute "
                     r"'unit_list'"),
        ("strata", r"sampler: AttributeError: 'Sampler' object has no attribute "
                   r"'strata_table'"),
    ],
)  # fmt: skip
def test_a_users_component_that_fails_to_build_is_one_line_naming_where(
    broken, message, components, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(components.parent))
    monkeypatch.setenv("UCB_BREAK", broken)
    code = train(tmp_path)
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    where = rf" \(at {re.escape(str(components))}:{LINES[broken]}\)"
    assert re.fullmatch(rf"metadist train: error: {message}{where}", lines[0]), lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_trained_run_whose_sampler_now_fails_is_one_line_on_loading(
    components, tmp_path, monkeypatch, capsys
):
    """The run trained; the user's module changed since: `metadist eval` (another
    process, another working directory) names the error and the user's line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(components.parent))
    monkeypatch.delenv("UCB_BREAK", raising=False)
    assert train(tmp_path) == 0, capsys.readouterr().err
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "UCB_BREAK": "attribute", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "eval", f"run_dir={tmp_path / 'run'}"]
        + ["--allow-import", "ucb_components"],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=elsewhere,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "metadist eval: error: sampler: AttributeError: 'Sampler' object has no attribute "
        f"'amplitude_table' (at {components}:{LINES['attribute']})"
    ]
