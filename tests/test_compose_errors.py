"""A config a user writes wrong, composed: one line naming the override, file or key,
before anything is written (`metadist.train.compose_errors`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from metadist.cli import main
from metadist.train.compose import compose_dict, find_experiments_dir


@pytest.fixture()
def experiments(tmp_path: Path) -> Path:
    """A copy of the shipped config tree, to add experiment files of one's own to."""
    copy = tmp_path / "experiments"
    shutil.copytree(find_experiments_dir(None), copy)
    return copy


def _through_the_shell(words: str) -> str:
    """The argument bash makes of `words`, as a user would paste them."""
    done = subprocess.run(
        ["bash", "-c", f"printf '%s' {words}"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _error(overrides: list[str], config_dir: Path | None = None) -> str:
    with pytest.raises(ValueError) as caught:
        compose_dict(overrides, config_dir)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_an_override_hydra_cannot_parse_is_named_with_the_quoting_that_reads_it():
    message = _error(["experiment=synthetic_maml", "data.store=a=b/store"])
    assert message.startswith("data.store=a=b/store: not an override Hydra can read (")
    assert "'data.store=\"a=b/store\"'" in message
    assert _through_the_shell("'data.store=\"a=b/store\"'") == 'data.store="a=b/store"'
    assert "hydra.cc" not in message
    # the remedy as given composes, the '=' kept
    assert compose_dict(["experiment=synthetic_maml", 'data.store="a=b/store"'])["data"][
        "store"
    ] == ("a=b/store")
    message = _error(["experiment=sinusoid_maml", "trainer.meta_steps=[1,2"])
    assert message.startswith("trainer.meta_steps=[1,2: not an override Hydra can read (")


def test_hydra_output_directory_is_refused_naming_run_dir(tmp_path, monkeypatch, capsys):
    """`hydra.run.dir` changed nothing: the run went to (and resumed) runs/<experiment>."""
    monkeypatch.chdir(tmp_path)
    status = main(["train", "experiment=sinusoid_maml", "hydra.run.dir=out", "--no-eval"])
    assert status == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "metadist train: error: hydra.run.dir=out: metadist makes no Hydra output "
        "directory; choose the run directory with run_dir=out"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing trained
    message = _error(["experiment=sinusoid_maml", "hydra/job_logging=disabled"])
    assert message.startswith("hydra/job_logging=disabled: Hydra's own settings (hydra.*)")
    assert _error(["experiment=sinusoid_maml", "+hydra.job.chdir=true"]).startswith(
        "+hydra.job.chdir=true: "
    )


def test_a_yaml_syntax_error_names_the_file_and_line(experiments, tmp_path, monkeypatch, capsys):
    mine = experiments / "experiment" / "mine.yaml"
    mine.write_text(
        "# @package _global_\ndefaults:\n  - /experiment/sinusoid_maml\n"
        "trainer:\n  meta_steps: 1\n   seed: 2\n"
    )
    monkeypatch.chdir(tmp_path)
    status = main(["train", "--config-dir", str(experiments), "experiment=mine", "--no-eval"])
    assert status == 1
    err = capsys.readouterr().err
    assert err == (
        f"metadist train: error: {mine}, line 6, column 8: not valid YAML: mapping values "
        "are not allowed here\n"
    )
    assert not (tmp_path / "runs").exists()


def test_an_experiment_without_its_package_line_is_named(experiments):
    """Without `# @package _global_` Hydra reads the file's keys under `experiment.`:
    the message was `experiment must be a string, got {...}`, or named
    `learner@experiment.learner`, not the file."""
    body = "defaults:\n  - /experiment/sinusoid_maml\ntrainer:\n  meta_steps: 1\n"
    mine = experiments / "experiment" / "mine.yaml"
    for text in (body, f"# my experiment\n# @package _global_\n{body}"):
        mine.write_text(text)
        message = _error(["experiment=mine"], experiments)
        assert message.startswith(
            f"{mine}: an experiment file must begin with the line `# @package _global_`"
        )
    mine.write_text(f"# @package _global_\n# my experiment\n{body}")
    composed = compose_dict(["experiment=mine"], experiments)
    assert composed["experiment"] == "mine" and composed["trainer"]["meta_steps"] == 1


def test_an_unset_environment_variable_names_the_key_and_the_variable(monkeypatch):
    monkeypatch.delenv("METADIST_TEST_UNSET", raising=False)
    message = _error(["experiment=sinusoid_maml", "run_dir=${oc.env:METADIST_TEST_UNSET}"])
    assert message == (
        "run_dir: the environment variable METADIST_TEST_UNSET is not set "
        "(${oc.env:METADIST_TEST_UNSET}); set it, or give a default: "
        "${oc.env:METADIST_TEST_UNSET,VALUE}"
    )
    monkeypatch.setenv("METADIST_TEST_UNSET", "runs/x")
    assert compose_dict(["experiment=sinusoid_maml", "run_dir=${oc.env:METADIST_TEST_UNSET}"])[
        "run_dir"
    ] == ("runs/x")
    message = _error(["experiment=sinusoid_maml", "trainer.seed=${trainer.nope}"])
    assert message == "trainer.seed: Interpolation key 'trainer.nope' not found"


def test_a_number_from_an_environment_variable_names_the_decoding(monkeypatch):
    """`${oc.env:X}` is a string: `trainer.seed must be an integer, got '3'` said no more."""
    from metadist.train.compose import load_config

    monkeypatch.setenv("METADIST_TEST_SEED", "3")
    with pytest.raises(ValueError) as caught:
        load_config(["experiment=sinusoid_maml", "trainer.seed=${oc.env:METADIST_TEST_SEED}"])
    remedy = "'trainer.seed=\"${oc.decode:${oc.env:NAME}}\"'"
    assert remedy in str(caught.value)
    # as a shell passes it on
    given = _through_the_shell(remedy.replace("NAME", "METADIST_TEST_SEED"))
    assert load_config(["experiment=sinusoid_maml", given]).trainer.seed == 3
