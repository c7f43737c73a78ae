"""`metadist.load_run`'s arguments: one path or module name is a list of one (a string
was read letter by letter: `ensemble="runs/b"` loaded the runs `r`, `u`, ..., and
`allow_imports="my_module_v2"` allowed any module whose name it contains); a wrong type
is one `ValueError` naming the argument (a `TypeError` named none)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import metadist
from metadist.cli import main

pytestmark = pytest.mark.integration

MODULE = textwrap.dedent(
    """
    from metadist.tasks import register_task_sampler
    from metadist.tasks.sinusoid import SinusoidSampler


    @register_task_sampler("ula_sampler")
    class Sampler(SinusoidSampler):
        pass
    """
)


def train(run_dir, *extra):
    code = main(
        ["train", "experiment=sinusoid_maml", f"run_dir={run_dir}", "trainer.meta_steps=2",
         "trainer.eval_every=0", "logging.progress=false", "logging.wandb.mode=disabled",
         "--no-eval", *extra]
    )  # fmt: skip
    assert code == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("load_run_arguments")
    (root / "ula_module.py").write_text(MODULE)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        train(root / "a")
        train(root / "b", "trainer.seed=1")
        train(root / "own", "imports=[ula_module]", "sampler.name=ula_sampler")
    return root


def test_one_ensemble_member_given_as_a_path(runs):
    x = torch.linspace(-5, 5, 7)[:, None]
    for member in (str(runs / "b"), runs / "b"):
        one = metadist.load_run(runs / "a", ensemble=member)
        listed = metadist.load_run(runs / "a", ensemble=[member])
        assert len(one.learner.members) == len(listed.learner.members) == 2
        assert torch.equal(one.learner.members[1].model(x), listed.learner.members[1].model(x))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"run_dir": None}, "run_dir must be a path (str or pathlib.Path), not None"),
        ({"store": 5}, "store must be a path (str or pathlib.Path), not 5"),
        ({"ensemble": [3]}, "ensemble[0] must be a path (str or pathlib.Path), not 3"),
        ({"ensemble": 3}, "ensemble must be a list of run directories, not 3"),
        ({"allow_imports": [1]}, "allow_imports must be a list of module names, not [1]"),
    ],
)
def test_an_argument_of_the_wrong_type_is_named(runs, arguments, message):
    given = {"run_dir": runs / "a", **arguments}
    with pytest.raises(ValueError) as raised:
        metadist.load_run(given.pop("run_dir"), **given)
    assert str(raised.value) == message


@pytest.mark.timeout(120)
def test_one_allowed_module_name_is_that_module_only(runs):
    """In a fresh process (where the module is not imported yet): the name allowed as one
    string is matched whole, not as a part of the string."""
    script = textwrap.dedent(
        f"""
        import metadist
        run = {str(runs / "own")!r}
        try:
            metadist.load_run(run, allow_imports="ula_module_v2")
        except ValueError as error:
            print("refused:", error)
        print(metadist.load_run(run, allow_imports="ula_module").config.sampler.name)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(runs), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=100,
        cwd=runs, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused: imports: the run imports module(s) 'ula_module'")
    assert lines[1:] == ["ula_sampler"]


def test_a_packed_run_is_named_as_an_archive_to_unpack(tmp_path):
    """A run shared as a tar.gz, given as it came: unpack it (it was `no run directory
    at run.tar.gz`, though a file is there)."""
    import tarfile

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("experiment: x\n")
    packed = tmp_path / "run.tar.gz"
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(tmp_path / "run", "run")
    with pytest.raises(FileNotFoundError) as refused:
        metadist.load_run(packed)
    assert str(refused.value) == (
        f"run_dir: {packed} is an archive, not a run directory: unpack it (tar xf, unzip) "
        "and give the run directory inside"
    )
    history = tmp_path / "history.parquet"
    history.write_bytes(b"PAR1")
    with pytest.raises(
        FileNotFoundError, match=r"run_dir: .*history.parquet is a file, not a run "
    ):
        metadist.load_run(history)
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "forecast", str(packed), str(history), "--out",
         str(tmp_path / "f.parquet")], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == f"metadist forecast: error: {refused.value}\n"
