"""A key no config has, added with `+` (`+new.key=1`), was refused with a stray "; "
before the valid names (`new: unknown field; (valid: ...)`): the line is clean, with or
without a hint."""

from __future__ import annotations

import subprocess
import sys

import pytest

from metadist.options import unknown_key_error

pytestmark = pytest.mark.integration


def test_a_new_top_level_key_is_one_clean_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "train", "experiment=sinusoid_maml", "+new.key=1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    line = done.stderr.strip()
    assert line.startswith("metadist train: error: new: unknown field (valid: data, eval, "), line
    assert "; (" not in line and ";;" not in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("path", "key", "choices", "expected"),
    [
        ("new", "new", ["data", "trainer"], "new: unknown field (valid: data, trainer)"),
        (
            "trainer.meta_step",
            "meta_step",
            ["meta_steps", "seed"],
            "trainer.meta_step: unknown field; did you mean 'meta_steps'? "
            "(valid: meta_steps, seed)",
        ),
        (
            "sampler.lookback",
            "lookback",
            ["name", "options"],
            "sampler.lookback: unknown field; a component's option is "
            "sampler.options.lookback (valid: name, options)",
        ),
        ("x.y", "y", [], "x.y: unknown field (valid: none)"),
    ],
)
def test_each_form_of_the_message(path, key, choices, expected):
    assert str(unknown_key_error(path, key, choices, "field")) == expected
