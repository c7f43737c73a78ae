"""An ensemble member whose outputs differ from the evaluated run's (a prototype
learner's embedding of another size, or a MAML head of a row per way beside an
embedding) is refused in one line naming it, not with torch's state-dict traceback."""

from __future__ import annotations

import pytest
from tiny_runs import train_tiny, ucr_store

import metadist
from metadist.cli import main as cli_main

SET = "UnitTest"  # 42 cases of 24 steps, 2 classes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ensemble-shapes")
    store = ucr_store(tmp, SET)
    return {
        "protonet": train_tiny(store, tmp / "protonet", "experiment=ucr_protonet"),
        "protonet32": train_tiny(
            store, tmp / "protonet32", "experiment=ucr_protonet", "model.output_shape=[32]"
        ),
        "maml": train_tiny(store, tmp / "maml", "experiment=ucr_maml"),
    }


@pytest.mark.parametrize(
    ("evaluated", "member", "weight", "given", "needed"),
    [
        ("protonet", "maml", "model.head.weight", "[2, 32]", "[64, 32]"),
        ("maml", "protonet", "model.head.weight", "[64, 32]", "[2, 32]"),
        ("protonet", "protonet32", "model.head.weight", "[32, 32]", "[64, 32]"),
    ],
)
def test_a_member_of_other_outputs_is_named_in_one_line(
    runs, capsys, evaluated, member, weight, given, needed
):
    said = (
        f"eval.ensemble: {runs[member]} does not give the evaluated run's outputs: its "
        f"{weight} is {given}, where outputs of shape"
    )
    with pytest.raises(ValueError, match="^" + said.replace("[", r"\[").replace("]", r"\]")):
        metadist.load_run(runs[evaluated], ensemble=[runs[member]])
    capsys.readouterr()
    code = cli_main(
        ["eval", f"run_dir={runs[evaluated]}", f"eval.ensemble=[{runs[member]}]",
         "eval.max_tasks=4"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith(f"metadist eval: error: {said}") and f"need {needed}" in err[0]


def test_a_member_of_the_same_outputs_still_joins(runs):
    run = metadist.load_run(runs["protonet"], ensemble=[runs["protonet"]])
    assert len(run.learner.members) == 2
