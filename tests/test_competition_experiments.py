"""`metadist competition --experiment-candidates`: other experiments (configs of
experiments/experiment/: another model, length, ...) as candidates a validation run
chooses among per group beside the loss, recorded in choices.json and trained alone by a
test run."""

from __future__ import annotations

from pathlib import Path

import pytest
from competition_data import write_competition

from metadist.commands.competition.candidates import (
    candidate_experiments,
    candidate_members,
    split_candidate,
    variant_key,
    variant_size,
)
from metadist.commands.competition.choice import CHOICES_FILE, describe, read_choices, write_choices
from metadist.commands.competition.cli import RECIPE_EXPERIMENT_CANDIDATES, build_parser, main
from metadist.commands.competition.members import Group, members_of, training_overrides
from metadist.commands.competition.plan import Plan
from metadist.commands.competition.series import SeriesInfo
from metadist.commands.competition.spec import CompetitionSpec
from metadist.train.compose import compose_dict

LOOKBACKS = [2.0, 3.0]
MLP = "competition_cpu_mlp"
OTHER = {MLP: False}  # the recipe's other experiment: its model takes no seasonal period


def choice_entry(**extra) -> dict:
    entry = {"loss": "smape", "weight": 1.0, "metric": "smape", "losses": {"smape": 1.0}}
    return {**entry, "method": "adapted", "fallback": "seasonal_naive", **extra}


def bare_plan(**fields) -> Plan:
    info = SeriesInfo({}, {}, {}, {}, {})
    return Plan("t", Path("."), CompetitionSpec(), info, Path("."), [4], None, [], [], **fields)


def test_the_cpu_recipes_other_experiment_is_the_mlp_without_seasonality_trained_longer():
    assert RECIPE_EXPERIMENT_CANDIDATES == {"default": (), "cpu": (MLP,)}
    own, other = compose_dict(["experiment=competition_cpu"]), compose_dict([f"experiment={MLP}"])
    assert own["model"]["options"]["window_norm"] == "seasonal"
    assert other["model"]["options"]["window_norm"] == "last"
    assert "seasonal_period" not in other["model"]["options"]
    assert other["trainer"]["meta_steps"] == 3 * own["trainer"]["meta_steps"]
    # everything else is the recipe's
    for section in ("learner", "optimizer", "sampler", "data", "eval"):
        assert other[section] == own[section], section


def test_another_experiment_trains_at_its_own_length_and_head_only():
    group = Group(8, ("Q",), 4, restricted=True)
    members = members_of(
        group, LOOKBACKS, ["smape"], 1, (None, 10), (None, "zero"), {None: True, **OTHER}
    )
    others = [m for m in members if m.experiment is not None]
    assert len(members) == 2 * 2 * 2 + 2 and len(others) == 2
    assert {(m.steps, m.head, m.experiment, m.takes_period) for m in others} == {
        (None, None, MLP, False)
    }
    out = Path("/runs/val")
    assert others[0].run_dir(out) == out / "h8-m4" / f"L16-smape-s1-E{MLP}"
    assert f"experiment {MLP}" in others[0].title()
    # the run's own members are named as before
    assert members[0].run_dir(out).name == "L16-smape-s1"
    assert "experiment" not in members[0].title()


def test_another_experiments_training_gives_a_period_only_where_its_model_takes_one(tmp_path):
    group = Group(8, ("Q",), 4, restricted=True)
    own, other = members_of(group, [2.0], ["smape"], 1, experiments={None: True, **OTHER})
    extra = ["trainer.meta_steps=3"]
    mine = training_overrides(own, "competition_cpu", tmp_path / "store", tmp_path, extra)
    theirs = training_overrides(other, "competition_cpu", tmp_path / "store", tmp_path, extra)
    assert mine[0] == "experiment=competition_cpu" and "model.options.seasonal_period=4" in mine
    assert theirs[0] == f"experiment={MLP}"
    assert not any("seasonal_period" in o for o in theirs)
    assert "trainer.meta_steps=3" in theirs  # the user's overrides apply to it too
    assert compose_dict(mine)["model"]["options"]["window_norm"] == "seasonal"
    assert compose_dict(theirs)["model"]["options"]["window_norm"] == "last"
    # an experiment whose model takes a period gets the group's
    taking = members_of(group, [2.0], ["smape"], 1, experiments={"competition_cpu": True})[0]
    overrides = training_overrides(taking, "competition", tmp_path / "s", tmp_path, [])
    assert overrides[0] == "experiment=competition_cpu"
    assert "model.options.seasonal_period=4" in overrides


def test_each_experiment_is_a_candidate_with_its_runs_of_lookbacks():
    experiments = {None: True, **OTHER}
    members = members_of(Group(4, ("Y",), 1), LOOKBACKS, ["mape", "smape"], 1, (None, 10),
                         experiments=experiments)  # fmt: skip
    candidates = candidate_members(
        members, ("mape", "smape"), LOOKBACKS, 4, (None, 10), (None,), list(experiments)
    )
    assert list(candidates) == [
        "mape", "mape L=2H", "smape", "smape L=2H",
        "mape S=10", "mape S=10 L=2H", "smape S=10", "smape S=10 L=2H",
        f"mape experiment={MLP}", f"mape experiment={MLP} L=2H",
        f"smape experiment={MLP}", f"smape experiment={MLP} L=2H",
    ]  # fmt: skip
    for key, chosen in candidates.items():
        loss, steps, head, lookbacks, other = split_candidate(key, LOOKBACKS)
        assert {(m.loss, m.steps, m.head, m.experiment) for m in chosen} == {
            (loss, steps, head, other)
        }
        assert sorted(m.lookback for m in chosen) == [int(4 * k) for k in lookbacks]
    assert variant_size(members) == 2 * 2  # lookbacks x losses, the run's experiment


def test_experiment_candidate_names_read_back():
    assert variant_key("smape", None, None, MLP) == f"smape experiment={MLP}"
    key = variant_key("mape", 50, "zero", "other")
    assert key == "mape S=50 head=zero experiment=other"
    assert split_candidate(key + " L=2H", LOOKBACKS) == ("mape", 50, "zero", [2.0], "other")
    assert split_candidate("smape", LOOKBACKS).experiment is None


def test_the_chosen_experiment_is_recorded_and_read(tmp_path):
    write_choices(tmp_path, {"4": choice_entry(experiment=MLP), "8": choice_entry()}, True)
    choices = read_choices(tmp_path, ["4", "8"], "smape")
    assert [choices[k]["experiment"] for k in ("4", "8")] == [MLP, None]
    assert f"chosen smape experiment {MLP} (" in describe("4", choices["4"])
    assert "chosen smape (" in describe("8", choices["8"])
    for bad in (0, "", "two words", [MLP], "../x"):
        write_choices(tmp_path, {"4": choice_entry(experiment=bad)}, True)
        with pytest.raises(ValueError, match=CHOICES_FILE):
            read_choices(tmp_path, ["4"], "smape")


def test_a_group_trains_every_experiment_on_validation_and_the_chosen_one_after():
    assert bare_plan().experiments_of("4") == {None: True}
    validation = bare_plan(candidates=("smape",), experiment_candidates=OTHER)
    assert validation.experiments_of("4") == {None: True, MLP: False}
    # candidates without candidate losses: no choice is made, so no other experiment trains
    assert bare_plan(experiment_candidates=OTHER).experiments_of("4") == {None: True}
    test = bare_plan(
        choices={"4": choice_entry(experiment=MLP), "8": choice_entry()},
        experiment_candidates=OTHER,
    )
    assert test.experiments_of("4") == {MLP: False}
    assert test.experiments_of("8") == {None: True}


def test_experiment_candidates_are_checked_against_the_runs_experiment(capsys):
    composed = compose_dict(["experiment=competition_cpu"])
    assert candidate_experiments("competition_cpu", composed, [MLP, MLP]) == OTHER
    assert candidate_experiments("competition_cpu", composed, ["competition_cpu"]) == {}
    assert "--experiment-candidates competition_cpu: the run's own experiment, left out" in (
        capsys.readouterr().out
    )
    with pytest.raises(ValueError, match="--experiment-candidates nosuch: no such experiment"):
        candidate_experiments("competition_cpu", composed, ["nosuch"])
    # a model that takes a period, beside a run whose groups have none to give
    plain = compose_dict(["experiment=competition"])
    with pytest.raises(ValueError, match="its model takes a seasonal period, the model of"):
        candidate_experiments("competition", plain, ["competition_cpu"])
    assert candidate_experiments("competition", plain, [MLP]) == OTHER


def test_experiment_candidates_are_parsed_as_names():
    args = build_parser().parse_intermixed_args(["data", "--experiment-candidates", "a", "b-c"])
    assert args.experiment_candidates == ["a", "b-c"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--losses", "smape", "--experiment-candidates", MLP], "chosen per group like"),
        (["--experiment-candidates", "model=nbeats"], "is not the name of an experiment config"),
    ],
)
def test_bad_experiment_candidates_are_named_in_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path), "--recipe", "cpu", *argv])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error and "Traceback" not in error


def test_an_unknown_experiment_candidate_stops_the_run_before_anything_is_written(tmp_path, capsys):
    data = write_competition(tmp_path / "data")
    out = tmp_path / "out"
    code = main([str(data), "--recipe", "cpu", "--validation", "--ets", "no",
                 "--experiment-candidates", "nosuch", "--out", str(out)])  # fmt: skip
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(error) == 1 and not out.exists()
    assert "--experiment-candidates nosuch: no such experiment config" in error[0]


def test_the_recipes_other_experiment_is_left_out_where_it_would_not_take_the_overrides(capsys):
    composed = compose_dict(["experiment=competition_cpu"])

    def recipe(overrides: list[str]) -> dict[str, bool]:
        return candidate_experiments("competition_cpu", composed, [MLP], overrides, True)

    # options both models have apply to both
    kept = [
        "trainer.meta_steps=4",
        "model.options.hidden_sizes=[8]",
        "model.options.head_init=zero",
    ]
    assert recipe(kept) == OTHER
    assert capsys.readouterr().out == ""
    for override in (
        "model.options.clamp=2",
        "model=nbeats",
        "+model.options.seasonality=additive",
    ):
        assert recipe([override]) == {}
        assert f"its model does not take {override}" in capsys.readouterr().out
    # asked for by name: kept, whatever the overrides
    asked = candidate_experiments("competition_cpu", composed, [MLP], ["model.options.clamp=2"])
    assert asked == OTHER


@pytest.mark.parametrize(
    ("override", "flag"),
    [
        ("run_dir=/tmp/elsewhere", "--out"),
        ("sampler.options.horizon=3", "--horizons"),
        ("+sampler.options.lookback=9", "--lookbacks"),
        ("learner.options.loss=mae", "--losses"),
        ("trainer.seed=4", "--seeds"),
        ("data.store=/tmp/st", "DATA_DIR"),
    ],
)
def test_an_override_of_what_the_command_sets_is_refused_before_anything(
    tmp_path, capsys, override, flag
):
    """The user's overrides came after the command's own and won unsaid (a run reported
    as the H=6 ensemble trained at horizon 3; run_dir= trained outside --out, then
    failed)."""
    data = write_competition(tmp_path / "data")
    out = tmp_path / "out"
    code = main([str(data), override, "--ets", "no", "--out", str(out)])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(error) == 1 and not out.exists(), error
    assert "metadist competition sets" in error[0] and flag in error[0]
