"""`metadist competition`: shorter trainings (`--step-candidates`) and other starts of the
output layer (`--head-candidates`) as candidates a validation run chooses among per group
beside the loss, recorded in choices.json and trained alone by a test run."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from metadist.commands.competition.candidates import (
    candidate_heads,
    candidate_lengths,
    candidate_members,
    split_candidate,
    variant_key,
    variant_size,
)
from metadist.commands.competition.choice import (
    CHOICES_FILE,
    describe,
    read_choices,
    write_choices,
)
from metadist.commands.competition.cli import (
    RECIPE_HEAD_CANDIDATES,
    RECIPE_STEP_CANDIDATES,
    main,
)
from metadist.commands.competition.members import Group, Member, members_of, training_overrides
from metadist.commands.competition.plan import Plan
from metadist.commands.competition.series import SeriesInfo
from metadist.commands.competition.spec import CompetitionSpec
from metadist.train.compose import compose_dict

LOOKBACKS = [2.0, 3.0]


def choice_entry(**extra) -> dict:
    entry = {"loss": "smape", "weight": 1.0, "metric": "mape", "losses": {"smape": 1.0}}
    return {**entry, "method": "adapted", "fallback": "seasonal_naive", **extra}


def _composed(args: argparse.Namespace, overrides: list[str]) -> dict:
    return compose_dict([f"experiment={args.experiment}", *overrides])


def bare_plan(**fields) -> Plan:
    info = SeriesInfo({}, {}, {}, {}, {})
    return Plan("t", Path("."), CompetitionSpec(), info, Path("."), [4], None, [], [], **fields)


def test_a_shorter_training_is_a_member_of_its_own():
    full, short = members_of(Group(4, ("Y",), 1), [2.0], ["smape"], 1, (None, 10))
    assert (full.steps, short.steps) == (None, 10)
    out = Path("/runs/val")
    assert full.run_dir(out).name == "L8-smape-s1"  # the experiment's: named as before
    assert short.run_dir(out).name == "L8-smape-s1-S10"
    assert "10 meta-steps" in short.title() and "meta-steps" not in full.title()
    # its length comes after the user's overrides: it is what the member is
    overrides = training_overrides(
        short, "competition_cpu", out / "store", out, ["trainer.meta_steps=99"]
    )
    assert overrides[-1] == "trainer.meta_steps=10"
    assert training_overrides(full, "competition_cpu", out / "store", out, [])[-1] != (
        "trainer.meta_steps=10"
    )


def test_each_length_and_loss_is_a_candidate_with_its_runs_of_lookbacks():
    members = members_of(Group(4, ("Y",), 1), LOOKBACKS, ["mape", "smape"], 1, (None, 10))
    candidates = candidate_members(members, ("mape", "smape"), LOOKBACKS, 4, (None, 10))
    assert list(candidates) == [
        "mape", "mape L=2H", "smape", "smape L=2H",
        "mape S=10", "mape S=10 L=2H", "smape S=10", "smape S=10 L=2H",
    ]  # fmt: skip
    for key, chosen in candidates.items():
        loss, steps, _, lookbacks, _ = split_candidate(key, LOOKBACKS)
        assert {(m.loss, m.steps) for m in chosen} == {(loss, steps)}
        assert sorted(m.lookback for m in chosen) == [int(4 * k) for k in lookbacks]
    # without shorter lengths the candidates are the losses' alone, as before
    plain = members_of(Group(4, ("Y",), 1), LOOKBACKS, ["smape"], 1)
    assert list(candidate_members(plain, ("smape",), LOOKBACKS, 4)) == ["smape", "smape L=2H"]


def test_candidate_names_read_back():
    assert variant_key("smape", None) == "smape" and variant_key("mape", 50) == "mape S=50"
    assert split_candidate("smape", LOOKBACKS) == ("smape", None, None, LOOKBACKS, None)
    assert split_candidate("mape S=50", LOOKBACKS) == ("mape", 50, None, LOOKBACKS, None)
    assert split_candidate("mape S=50 L=2H", LOOKBACKS) == ("mape", 50, None, [2.0], None)
    assert split_candidate("smape L=2H+3H", LOOKBACKS) == ("smape", None, None, LOOKBACKS, None)


def test_the_chosen_length_is_recorded_and_read(tmp_path):
    write_choices(
        tmp_path,
        {"4": choice_entry(steps=10), "8": choice_entry(steps=None), "24": choice_entry()},
        True,
    )
    choices = read_choices(tmp_path, ["4", "8", "24"], "mape")
    assert [choices[k]["steps"] for k in ("4", "8", "24")] == [10, None, None]
    assert "chosen smape 10 meta-steps (" in describe("4", choices["4"])
    assert "meta-steps" not in describe("8", choices["8"])
    for bad in (0, 2.5, "10", True):
        write_choices(tmp_path, {"4": choice_entry(steps=bad)}, True)
        with pytest.raises(ValueError, match=CHOICES_FILE):
            read_choices(tmp_path, ["4"], "mape")


def test_a_group_trains_every_length_on_validation_and_the_chosen_one_after():
    assert bare_plan().steps_of("4") == (None,)
    validation = bare_plan(candidates=("mape",), step_candidates=(10, 50))
    assert validation.steps_of("4") == (None, 10, 50)
    # candidates without candidate losses: no choice is made, so nothing shorter trains
    assert bare_plan(step_candidates=(10,)).steps_of("4") == (None,)
    test = bare_plan(choices={"4": choice_entry(steps=10), "8": choice_entry(steps=None)})
    assert test.steps_of("4") == (10,) and test.steps_of("8") == (None,)


def test_lengths_not_shorter_than_the_experiment_are_left_out(capsys):
    args = argparse.Namespace(experiment="competition_cpu", step_candidates=[50, 10, 600, 900])
    assert candidate_lengths(args, _composed(args, [])) == (10, 50)  # the recipe trains at most 600
    assert "--step-candidates 600, 900: not shorter than the experiment's 600" in (
        capsys.readouterr().out
    )
    assert candidate_lengths(args, _composed(args, ["trainer.meta_steps=20"])) == (10,)
    unset = argparse.Namespace(experiment="competition_cpu")
    assert candidate_lengths(unset, _composed(unset, [])) == ()


def test_the_cpu_recipe_tries_two_shorter_lengths():
    assert RECIPE_STEP_CANDIDATES == {"default": (), "cpu": (10, 50)}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--losses", "smape", "--step-candidates", "10"], "--losses trains one ensemble"),
        (["--step-candidates", "10"], "give --loss-candidates"),  # the default recipe has none
        (["--recipe", "cpu", "--step-candidates", "0"], "--step-candidates must be >= 1"),
        (["--losses", "smape", "--head-candidates", "zero"], "--losses trains one ensemble"),
        (["--head-candidates", "zero"], "give --loss-candidates"),  # the default recipe has none
        (["--recipe", "cpu", "--head-candidates", "small"], "invalid choice: 'small'"),
    ],
)
def test_candidates_that_cannot_apply_are_refused(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path), "--validation", *extra])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error and "Traceback" not in error


def test_an_old_choice_without_a_length_trains_the_experiments(tmp_path):
    write_choices(tmp_path, {"4": choice_entry(lookbacks=[2.0])}, True)
    choices = read_choices(tmp_path, ["4"], "mape")
    members = members_of(Group(4, ("Y",), 1), [2.0], ["smape"], 1, (choices["4"]["steps"],))
    assert members == [Member(4, 8, "smape", 1, 1, (), None, None)]


def test_another_head_is_a_member_of_its_own_that_trains_with_it():
    full, zero = members_of(Group(4, ("Y",), 1), [2.0], ["smape"], 1, heads=(None, "zero"))
    assert (full.head, zero.head) == (None, "zero")
    out = Path("/runs/val")
    assert full.run_dir(out).name == "L8-smape-s1"  # the experiment's: named as before
    assert zero.run_dir(out).name == "L8-smape-s1-Hzero"
    assert "zero head" in zero.title() and "head" not in full.title()
    # the head comes after the user's overrides (a candidate is what it is), before the length
    short = members_of(Group(4, ("Y",), 1), [2.0], ["smape"], 1, (10,), ("zero",))[0]
    assert short.run_dir(out).name == "L8-smape-s1-S10-Hzero"
    overrides = training_overrides(
        short, "competition_cpu", out / "store", out, ["model.options.head_init=default"]
    )
    assert overrides[-2:] == ["model.options.head_init=zero", "trainer.meta_steps=10"]
    composed = compose_dict(overrides)
    assert composed["model"]["options"]["head_init"] == "zero"
    plain = compose_dict(training_overrides(full, "competition_cpu", out / "store", out, []))
    assert plain["model"]["options"]["head_init"] == "default"


def test_each_head_length_and_loss_is_a_candidate_with_its_runs_of_lookbacks():
    members = members_of(Group(4, ("Y",), 1), LOOKBACKS, ["smape"], 1, (None, 10), (None, "zero"))
    candidates = candidate_members(members, ("smape",), LOOKBACKS, 4, (None, 10), (None, "zero"))
    assert list(candidates) == [
        "smape", "smape L=2H", "smape S=10", "smape S=10 L=2H",
        "smape head=zero", "smape head=zero L=2H",
        "smape S=10 head=zero", "smape S=10 head=zero L=2H",
    ]  # fmt: skip
    for key, chosen in candidates.items():
        loss, steps, head, lookbacks, _ = split_candidate(key, LOOKBACKS)
        assert {(m.loss, m.steps, m.head) for m in chosen} == {(loss, steps, head)}
        assert sorted(m.lookback for m in chosen) == [int(4 * k) for k in lookbacks]


def test_head_candidate_names_read_back():
    assert variant_key("smape", None, "zero") == "smape head=zero"
    assert variant_key("mape", 50, "zero") == "mape S=50 head=zero"
    assert split_candidate("mape S=50 head=zero L=2H", LOOKBACKS) == (
        "mape",
        50,
        "zero",
        [2.0],
        None,
    )
    assert split_candidate("smape head=zero", LOOKBACKS) == ("smape", None, "zero", LOOKBACKS, None)


def test_the_chosen_head_is_recorded_and_read(tmp_path):
    write_choices(tmp_path, {"4": choice_entry(head="zero", steps=10), "8": choice_entry()}, True)
    choices = read_choices(tmp_path, ["4", "8"], "mape")
    assert [choices[k]["head"] for k in ("4", "8")] == ["zero", None]
    assert "chosen smape 10 meta-steps, zero head (" in describe("4", choices["4"])
    assert "head" not in describe("8", choices["8"])
    for bad in (0, "", "zero head", ["zero"]):
        write_choices(tmp_path, {"4": choice_entry(head=bad)}, True)
        with pytest.raises(ValueError, match=CHOICES_FILE):
            read_choices(tmp_path, ["4"], "mape")


def test_a_group_trains_every_head_on_validation_and_the_chosen_one_after():
    assert bare_plan().heads_of("4") == (None,)
    assert bare_plan(candidates=("mape",), head_candidates=("zero",)).heads_of("4") == (
        None,
        "zero",
    )
    # candidates without candidate losses: no choice is made, so no other head trains
    assert bare_plan(head_candidates=("zero",)).heads_of("4") == (None,)
    test = bare_plan(choices={"4": choice_entry(head="zero"), "8": choice_entry()})
    assert test.heads_of("4") == ("zero",) and test.heads_of("8") == (None,)


def test_the_experiments_own_head_is_left_out(capsys):
    args = argparse.Namespace(experiment="competition_cpu", head_candidates=["zero", "zero"])
    assert candidate_heads(args, _composed(args, [])) == ("zero",)
    assert candidate_heads(args, _composed(args, ["model.options.head_init=zero"])) == ()
    assert "--head-candidates zero: the experiment's own head, left out" in (
        capsys.readouterr().out
    )
    unset = argparse.Namespace(experiment="competition_cpu")
    assert candidate_heads(unset, _composed(unset, [])) == ()


def test_the_cpu_recipe_tries_a_zero_head():
    assert RECIPE_HEAD_CANDIDATES == {"default": (), "cpu": ("zero",)}


def test_head_candidates_need_a_model_with_a_head_init(capsys):
    nbeats = ["model=nbeats"]
    asked = argparse.Namespace(experiment="competition", head_candidates=["zero"])
    with pytest.raises(ValueError, match="model of experiment=competition has no head_init"):
        candidate_heads(asked, _composed(asked, nbeats))
    # the recipe's own candidates, not asked for, are left out with a note
    from_recipe = argparse.Namespace(**vars(asked), head_candidates_from_recipe=True)
    assert candidate_heads(from_recipe, _composed(from_recipe, nbeats)) == ()
    assert "the recipe's head candidates are left out" in capsys.readouterr().out


def test_the_table_counts_the_models_of_one_candidates_ensemble():
    group = Group(4, ("Y",), 1)
    validation = members_of(group, [2.0, 3.0], ["mape", "smape"], 2, (None, 10), (None, "zero"))
    assert variant_size(validation) == 2 * 2 * 2  # lookbacks x losses x seeds
    test = members_of(group, [2.0], ["smape"], 1, (10,), ("zero",))
    assert variant_size(test) == 1
