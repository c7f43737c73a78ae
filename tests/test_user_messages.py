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


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["competition", "d", "--horizons", "5", "trainer.meta_steps=2"],
         "argument --horizons: 'trainer.meta_steps=2' is not a whole number; put overrides "
         "before --horizons"),
        (["competition", "d", "--seeds", "0"], "--seeds must be >= 1, got 0"),
        # the optional overrides were listed as required beside DATA_DIR
        (["competition"], "the following arguments are required: DATA_DIR ("),
        (["competition", "d", "--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["train", "--nproc-per-node", "x"], "argument --nproc-per-node: invalid int value"),
        (["bogus"], "argument COMMAND: invalid choice: 'bogus'"),
        # an abbreviated flag is not taken for the full one (--nproc-per-nod reached each
        # rank unremoved and every rank launched ranks, without end)
        (["train", "--nproc-per-nod=2", "experiment=sinusoid_maml"],
         "unrecognized arguments: --nproc-per-nod=2; did you mean --nproc-per-node?"),
        (["eval", "--nproc=2", "run_dir=x"], "unrecognized arguments: --nproc=2"),
    ],
)  # fmt: skip
def test_a_bad_argument_is_one_line_naming_it(capsys, argv, said):
    """argparse printed its usage block (15 lines for competition) before the line."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1 and said in err[0], err
    assert err[0].endswith("--help)")


def test_a_rank_never_launches_ranks(monkeypatch):
    from metadist.launch.local_ranks import OWNER_ENV, run_local_ranks

    monkeypatch.setenv(OWNER_ENV, "metadist train")
    with pytest.raises(ValueError, match="already one of the ranks of a launch"):
        run_local_ranks("metadist.train", ["experiment=x"], 2, "metadist train")
