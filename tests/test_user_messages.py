"""Small things a new user reads: the demo's counts, the train help's learner list."""

from __future__ import annotations

from pathlib import Path

import pytest

from metadist.cli import main
from metadist.demo import cpu_processes

SHIPPED = Path(__file__).resolve().parents[1] / "experiments"


def test_the_demo_counts_processes_in_english():
    assert cpu_processes(1) == "1 CPU process"
    assert cpu_processes(2) == "2 CPU processes"


def test_datasets_competition_help_names_the_competitions(capsys):
    from metadist.datasets.fcomp import COMPETITIONS

    with pytest.raises(SystemExit):
        main(["datasets", "competition", "--help"])
    assert f"which competition: {', '.join(sorted(COMPETITIONS))}" in capsys.readouterr().out


def test_train_help_names_every_shipped_learner(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for learner in sorted(p.stem for p in (SHIPPED / "learner").glob("*.yaml")):
        assert f" {learner}," in text or f" {learner})" in text, learner
