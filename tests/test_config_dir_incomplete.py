"""`--config-dir DIR` holding part of a config tree (an `experiment/mine.yaml` alone, or
no `model/` group): the message said "pass --config-dir PATH" to a command given one, or
"no such model (the models: none)", never what DIR lacks. The configs are found in
DIR alone (docs/training.md), so the line names what DIR lacks and how to get a whole
tree."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from metadist.configs import find_experiments_dir
from metadist.train.compose import compose_dict

pytestmark = pytest.mark.integration

SHIPPED = find_experiments_dir(None)
REMEDY = (
    "an experiments directory holds the whole config tree (`metadist experiments copy "
    "NAME DEST` copies the shipped one to edit)"
)


def _mine(tmp_path):
    mine = tmp_path / "mine"
    (mine / "experiment").mkdir(parents=True)
    shutil.copy(SHIPPED / "experiment" / "sinusoid_maml.yaml", mine / "experiment" / "mine.yaml")
    return mine


def test_an_experiment_file_alone_is_one_line_naming_what_is_missing(tmp_path):
    mine = _mine(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "train", "--config-dir", "mine", "experiment=mine"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "metadist train: error: no experiments directory with a config.yaml found "
        "(--config-dir: mine); mine lacks config.yaml, data/, sampler/, model/, learner/, "
        f"optimizer/, trainer/, logging/, eval/: {REMEDY}"
    ], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no runs/
    assert sorted(p.name for p in mine.iterdir()) == ["experiment"]


def test_a_tree_without_some_groups_names_them(tmp_path):
    mine = _mine(tmp_path)
    shutil.copy(SHIPPED / "config.yaml", mine / "config.yaml")
    with pytest.raises(ValueError) as caught:
        compose_dict(["experiment=mine"], str(mine))
    message = str(caught.value)
    assert message.endswith(
        f"{mine} lacks data/, sampler/, model/, learner/, optimizer/, trainer/, logging/, "
        f"eval/: {REMEDY}"
    ), message
    assert ": no such " in message and "\n" not in message
    for group in ("data", "sampler", "learner", "optimizer", "trainer", "logging", "eval"):
        shutil.copytree(SHIPPED / group, mine / group)
    (mine / "model").mkdir()  # there, but holding no config
    with pytest.raises(ValueError) as caught:
        compose_dict(["experiment=mine"], str(mine))
    assert str(caught.value) == (
        f"model=mlp, in the defaults of {mine / 'config.yaml'}: no such model: {mine} lacks "
        f"model/: {REMEDY}"
    )
    shutil.rmtree(mine / "model")
    shutil.copytree(SHIPPED / "model", mine / "model")
    assert compose_dict(["experiment=mine"], str(mine))["experiment"] == "mine"


def test_a_config_dir_that_is_not_there(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        find_experiments_dir(tmp_path / "nowhere")
    assert str(caught.value) == (
        f"no experiments directory with a config.yaml found (--config-dir: "
        f"{tmp_path / 'nowhere'}); {tmp_path / 'nowhere'} is not a directory; {REMEDY}"
    )
