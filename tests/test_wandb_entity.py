"""A `logging.wandb.entity` that no wandb server accepts (empty, blank, with whitespace
or a character of a path or URL) is one line naming the setting, before anything is
built or written; wandb itself would take it and the run would fail only when synced."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from metadist.train.compose import load_config


@pytest.mark.parametrize(
    ("entity", "words"),
    [
        ("'my team'", ["'my team'", "found whitespace"]),
        ("team/metadist", ["'team/metadist'", "found /"]),
        ("'a:b'", ["'a:b'", "found :"]),
        ("''", ["''", "not empty", "logging.wandb.entity=null"]),
        ("' '", ["' '", "not empty or blank"]),
    ],
)
def test_a_bad_entity_names_the_setting(entity, words):
    with pytest.raises(ValueError, match=r"logging\.wandb\.entity=") as caught:
        load_config(["experiment=sinusoid_maml", f"logging.wandb.entity={entity}"])
    for word in words:
        assert word in str(caught.value)


@pytest.mark.parametrize("entity", ["null", "my-team", "my_team", "Team42"])
def test_a_good_entity_is_kept(entity):
    config = load_config(["experiment=sinusoid_maml", f"logging.wandb.entity={entity}"])
    assert config.logging.wandb.entity == (None if entity == "null" else entity)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_command_line_says_it_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    argv = ["train", "experiment=sinusoid_maml", f"run_dir={run_dir}", "trainer.meta_steps=2"]
    argv += ["logging.progress=false", "--no-eval", "logging.wandb.entity=a b"]
    code = f"import sys; from metadist.cli import main; sys.exit(main({argv!r}))"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WANDB_MODE", None)  # offline, as configured: the entity is checked all the same
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=100, env=env
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("metadist train: error: logging.wandb.entity='a b'"), done.stderr
    assert not run_dir.exists()
