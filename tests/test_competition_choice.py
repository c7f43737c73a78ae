"""`metadist competition`: the loss chosen per group on validation, the model's weight
against seasonal naive learned there, both recorded and applied by a test run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from competition_data import competition_runner, write_quarterly, write_yearly_history

from metadist.commands.competition.candidates import candidate_members, split_candidate
from metadist.commands.competition.choice import (
    CHOICES_FILE,
    best_method,
    candidate_losses,
    choose_group,
    read_choices,
    split_key,
    write_choices,
)
from metadist.commands.competition.cli import RECIPE_CANDIDATES
from metadist.commands.competition.guard import (
    guarded_scores,
    read_histories,
    read_points,
    write_guarded,
)
from metadist.commands.competition.members import Group, members_of
from metadist.commands.competition.plan import Plan, _loss_plan
from metadist.commands.competition.spec import CompetitionSpec
from metadist.eval.combine import CHOSEN_LABEL
from metadist.eval.fallback_combination import (
    WEIGHTS,
    fit_shrinkage,
    pooled_score,
    shrunk,
)
from metadist.eval.metrics import point_terms
from metadist.eval.plausibility import parse_width, recorded_guard, recorded_model

ROOT = Path(__file__).resolve().parents[1]


# histories whose growth varies so widely that no band binds a forecast near 10
WILD = {"a": [1.0, 100.0, 1.0, 100.0, 10.0], "b": [1.0, 100.0, 1.0, 100.0, 10.0]}


def _evaluated(run: Path, truth, model, fallback, scores: dict[str, float], histories=None) -> Path:
    """A fake evaluated run: two series of len(truth) / 2 points each, trained on a
    store of `histories` (yearly, period 1)."""
    (run / "eval").mkdir(parents=True)
    write_yearly_history(run, histories or WILD)
    half = len(truth) // 2
    entities = ["a"] * half + ["b"] * (len(truth) - half)
    points = pd.DataFrame(
        {
            "frequency": "yearly",
            "entity": entities,
            "step": list(range(half)) * 2,
            "truth": truth,
            "adapted": model,
            "unadapted": model,
            "seasonal_naive": fallback,
        }
    )
    points.to_parquet(run / "eval" / "forecasts.parquet")
    tasks = pd.DataFrame(
        {
            "group:entity": ["a", "b"],
            "seasonal_naive:mae": [2.0, 2.0],
            "seasonal_naive:mase": [1.0, 1.0],
        }
    )
    tasks.to_parquet(run / "eval" / "tasks.parquet")
    overall = {m: {"mape": {"value": v}} for m, v in scores.items()}
    (run / "eval" / "metrics.json").write_text(
        json.dumps({"primary_metric": "mape", "overall": overall})
    )
    return run


def test_pooled_scores_leave_out_a_task_with_an_undefined_sum():
    terms = np.array([1.0, 3.0, np.nan, 10.0])
    assert pooled_score(terms, np.array(["a", "a", "b", "b"])) == 2.0
    assert np.isnan(pooled_score(np.array([np.nan]), np.array(["a"])))
    assert point_terms("mase", np.array([3.0]), np.array([1.0]), np.array([2.0]))[0] == 1.0
    with pytest.raises(ValueError, match="metric must be one of"):
        point_terms("owa", np.ones(1), np.ones(1))
    assert shrunk(np.array([np.nan, 4.0]), np.array([2.0, 2.0]), 0.5).tolist() == [2.0, 3.0]


def test_the_weight_follows_whichever_forecast_is_right():
    truth = np.array([10.0, 12.0, 11.0, 13.0])
    tasks = np.array(["a", "a", "b", "b"])
    right, wrong = truth.copy(), truth * 1.5
    assert fit_shrinkage("mape", truth, right, wrong, tasks)[0] == 1.0
    assert fit_shrinkage("mape", truth, wrong, right, tasks)[0] == 0.0
    # errors of opposite sign: the middle cancels them
    weight, scores = fit_shrinkage("smape", truth, truth + 2, truth - 2, tasks)
    assert weight == 0.5 and set(scores) == set(WEIGHTS)
    # the same forecast twice: a tie everywhere keeps the model
    assert fit_shrinkage("mae", truth, right, right, tasks)[0] == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        fit_shrinkage("mape", truth, right, wrong[:2], tasks)


def test_the_loss_is_chosen_by_the_validation_score_and_recorded(tmp_path):
    truth = np.array([10.0, 12.0, 11.0, 13.0])
    worse = _evaluated(tmp_path / "m", truth, truth * 1.3, truth * 0.8, {"adapted": 30.0})
    better = _evaluated(
        tmp_path / "s", truth, truth * 1.1, truth * 0.9, {"adapted": 10.0, "unadapted": 9.0}
    )
    assert best_method(better) == ("unadapted", 9.0, "mape")
    entry = choose_group({"mape": worse, "smape": better})
    assert entry["loss"] == "smape" and entry["method"] == "unadapted"
    assert entry["losses"] == {"mape": 30.0, "smape": 9.0}
    assert entry["weight"] == 0.5  # +10 % and −10 %: the middle is exact
    assert entry["guard"] == "none"  # no band binds: every width ties, no guard wins
    write_choices(tmp_path, {"4": entry}, validation=True)
    assert read_choices(tmp_path, ["4"], "mape")["4"]["loss"] == "smape"
    with pytest.raises(ValueError, match="chose by mape, this run's primary metric is smape"):
        read_choices(tmp_path, ["4"], "smape")
    with pytest.raises(ValueError, match="no choice for horizon 8"):
        read_choices(tmp_path, ["8"], "mape")
    write_choices(tmp_path, {"4": entry}, validation=False, source=tmp_path)
    with pytest.raises(ValueError, match="written by a test run"):
        read_choices(tmp_path, ["4"], "mape")
    (tmp_path / CHOICES_FILE).write_text("[]")
    with pytest.raises(ValueError, match="not a choice written by metadist competition"):
        read_choices(tmp_path, ["4"], "mape")
    assert read_choices(tmp_path / "m", ["4"], "mape") is None  # none made
    scores = guarded_scores([(better, "unadapted", 0.5)], "mape")
    assert scores["all"]["shrunk"]["mape"] == pytest.approx(0.0)
    assert scores["yearly"]["model"]["mape"] == pytest.approx(10.0)
    assert scores["yearly"]["unguarded"]["mape"] == pytest.approx(10.0)
    assert read_points(better, "adapted")["scale"].tolist() == [2.0] * 4


def test_the_band_is_chosen_on_validation_and_the_test_run_applies_it(tmp_path):
    # growth of 5 % and 15 % a year in turn; the truth grows 10 %, the model doubles it
    growth = np.cumprod([1.0, *[1.05, 1.15] * 4])
    histories = {"a": 100.0 * growth, "b": 50.0 * growth}
    truth = np.concatenate([h[-1] * 1.1 ** np.arange(1, 3) for h in histories.values()])
    val = _evaluated(
        tmp_path / "val", truth, truth * 2.0, truth * 0.5, {"unadapted": 100.0}, histories
    )
    assert np.allclose(read_histories(val)["b"], histories["b"])
    entry = choose_group({"smape": val})
    # the tightest band (the middle half of the history's growth) comes nearest
    guards = entry["guards"]
    assert entry["guard"] == "0" and guards["0"] < guards["0.5"] < guards["3"] < guards["none"]
    # the weight is fitted on the guarded model: near the truth, it keeps most weight
    # (unguarded, 2 · truth against 0.5 · truth, the best weight would be 1/3)
    assert entry["weight"] >= 0.8
    write_choices(tmp_path / "val", {"4": entry}, validation=True)
    assert read_choices(tmp_path / "val", ["4"], "mape")["4"]["guard"] == "0"
    test, out = tmp_path / "test", tmp_path / "out"
    _evaluated(test, truth, truth * 2.0, truth * 0.5, {"unadapted": 100.0}, histories)
    out.mkdir()
    write_choices(out, {"4": entry}, validation=False, source=tmp_path / "val")
    (out / "metrics.md").write_text(f"| {CHOSEN_LABEL} | 1.0 |\n")
    assert recorded_guard(test) is None
    table = write_guarded(out, [(test, "unadapted", entry["weight"])], "mape", {"4": 1.0})
    assert recorded_guard(test) == 0.0  # load_run(test).forecast applies it
    scores = json.loads((out / "guarded.json").read_text())["scores"]["all"]
    assert scores["model"]["mape"] < 10.0  # clipped at 15 % growth a year
    assert scores["unguarded"]["mape"] == pytest.approx(100.0, abs=1e-3)
    assert "model, unguarded" in table and "band widths by group (validation): H=4: 0" in table
    # the guarded row and metrics.md's model row name which is which
    assert "| model, guarded as chosen on validation |" in table
    assert recorded_model(test) == "unadapted"  # load_run(test).forecast's default
    assert "guarded.md scores the model guarded" in (out / "metrics.md").read_text()
    entry["guard"] = "wide"
    write_choices(tmp_path / "val", {"4": entry}, validation=True)
    with pytest.raises(ValueError, match="not a choice written by metadist competition"):
        read_choices(tmp_path / "val", ["4"], "mape")


def test_points_are_read_in_step_order_for_the_guard(tmp_path):
    truth = np.array([10.0, 12.0, 11.0, 13.0])
    run = _evaluated(tmp_path / "r", truth, truth, truth, {"adapted": 0.0})
    path = run / "eval" / "forecasts.parquet"
    pd.read_parquet(path).iloc[::-1].to_parquet(path)  # steps backwards
    points = read_points(run, "adapted")
    assert points["task"].tolist() == ["a", "a", "b", "b"]
    assert points["truth"].tolist() == truth.tolist()


def test_the_cpu_recipe_tries_the_metric_and_smape():
    assert RECIPE_CANDIDATES == {"default": (), "cpu": ("smape",)}
    losses = ("mse", "mae", "smape", "mape")
    assert candidate_losses("mape", ["smape"], losses) == ("mape", "smape")
    assert candidate_losses("smape", ["smape"], losses) == ("smape",)
    assert candidate_losses("mase", ["smape"], losses) == ("smape",)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_validation_run_chooses_the_loss_and_a_test_run_applies_it(tmp_path):
    data = write_quarterly(tmp_path / "data", 8, 40, "mape")
    val, test = tmp_path / "val", tmp_path / "test"
    tiny = [
        *("trainer.meta_steps=4", "trainer.meta_batch_size=4", "trainer.eval_every=2"),
        "model.options.hidden_sizes=[8]",
    ]
    run = competition_runner(
        [str(data), "--recipe", "cpu", "--ets", "no", "--jobs", "2", *tiny], timeout=280
    )

    # a training of 2 meta-steps beside the experiment's 4 (the recipe's 10 and 50 are
    # not shorter: left out); the recipe's zero head beside the experiment's, and its
    # other experiment (at its own length and head)
    printed = run(
        "--validation", "--out", str(val), "--step-candidates", "2", "--lookbacks", "2", "3"
    )
    document = json.loads((val / CHOICES_FILE).read_text())
    assert document["protocol"] == "validation"
    entry = document["groups"]["4"]
    # the ensemble of lookbacks 2H and 3H per loss, length, head and experiment, and 2H alone
    runs = ("", " L=2H")
    variants = [s + h for s in ("", " S=2") for h in ("", " head=zero")] + [
        " experiment=competition_cpu_mlp"
    ]
    assert set(entry["losses"]) == {
        loss + variant + run for loss in ("mape", "smape") for variant in variants for run in runs
    }
    assert entry["metric"] == "mape" and f"chosen {entry['loss']}" in printed

    def suffix(steps: int | None, head: str | None, other: str | None = None) -> str:
        return (
            ("" if steps is None else f"-S{steps}")
            + ("" if head is None else f"-H{head}")
            + ("" if other is None else f"-E{other}")
        )

    # each candidate's score is its own evaluation on the validation split's holdout
    for key, score in entry["losses"].items():
        loss, steps, head, lookbacks, other = split_candidate(key, [2.0, 3.0])
        # the longest lookback's run
        evaluated = f"L{4 * int(max(lookbacks))}-{loss}-s1{suffix(steps, head, other)}"
        result = json.loads((val / "h4" / evaluated / "eval" / "metrics.json").read_text())
        assert "validation_data" in json.dumps(result["settings"])
        assert score == pytest.approx(min(result["overall"][m]["mape"]["value"]
                                            for m in ("adapted", "unadapted")))  # fmt: skip
    best = min(entry["losses"], key=entry["losses"].get)
    assert split_candidate(best, [2.0, 3.0]) == (
        entry["loss"], entry["steps"], entry["head"], entry["lookbacks"], entry["experiment"]
    )  # fmt: skip
    printed = run("--out", str(test), "--adaptation-from", str(val), "--lookbacks", "2", "3")
    trained = sorted(p.name for p in (test / "h4").iterdir() if p.is_dir())
    own = suffix(entry["steps"], entry["head"], entry["experiment"])
    chosen = sorted(f"L{4 * int(k)}-{entry['loss']}-s1{own}" for k in entry["lookbacks"])
    assert trained == chosen  # the chosen loss, length, head and lookbacks alone
    applied = json.loads((test / CHOICES_FILE).read_text())
    assert applied["protocol"] == "test" and applied["from"] == str(val)
    assert "shrunk towards seasonal naive" in printed and "model, unguarded" in printed
    assert (test / "guarded.md").is_file()
    # the longest lookback's
    evaluated = f"L{4 * int(max(entry['lookbacks']))}-{entry['loss']}-s1{own}"
    assert recorded_guard(test / "h4" / evaluated) == parse_width(entry["guard"])


def test_losses_beside_a_validation_choice_are_refused(tmp_path, capsys):
    entry = {"loss": "smape", "weight": 0.5, "metric": "smape", "losses": {"smape": 1.0}}
    write_choices(tmp_path, {"4": entry}, validation=True)
    args = argparse.Namespace(
        adaptation_from=tmp_path, losses=["mae"], loss_candidates=["smape"],
        recipe_candidates=True, validation=False, experiment="competition_cpu",
    )  # fmt: skip
    spec, groups = CompetitionSpec(metric="smape"), [Group(4, ("Y",), 1)]
    with pytest.raises(ValueError, match="chose each group's loss on validation"):
        _loss_plan(args, spec, groups, ("mae",), [])
    args.losses = None
    losses, candidates, choices = _loss_plan(args, spec, groups, ("smape",), [])
    assert candidates == () and choices is not None and choices["4"]["loss"] == "smape"
    args.adaptation_from, spec = None, CompetitionSpec(metric="mape")
    assert _loss_plan(args, spec, groups, ("mape",), [])[:2] == (("mape",), ())
    assert "without --adaptation-from VAL_OUT this run trains mape" in capsys.readouterr().out
    args.validation = True
    assert _loss_plan(args, spec, groups, ("mape",), [])[:2] == (("mape", "smape"),) * 2


def test_each_loss_has_its_first_lookback_alone_as_a_candidate():
    members = members_of(Group(4, ("Y",), 1), [2.0, 3.0], ["mape", "smape"], 1)
    candidates = candidate_members(members, ("mape", "smape"), [2.0, 3.0], 4)
    assert list(candidates) == ["mape", "mape L=2H", "smape", "smape L=2H"]
    assert [m.lookback for m in candidates["smape"]] == [8, 12]
    assert [(m.lookback, m.loss) for m in candidates["smape L=2H"]] == [(8, "smape")]
    # one lookback: nothing to choose between
    single = members_of(Group(4, ("Y",), 1), [2.0], ["smape"], 2)
    assert list(candidate_members(single, ("smape",), [2.0], 4)) == ["smape"]
    assert split_key("smape L=2H", [2.0, 3.0]) == ("smape", [2.0])
    assert split_key("smape", [2.0, 3.0]) == ("smape", [2.0, 3.0])
    assert split_key("mape L=2.5H", [2.5, 3.0]) == ("mape", [2.5])


def test_wider_ensembles_have_each_run_of_first_lookbacks_as_a_candidate():
    lookbacks = [2.0, 3.0, 4.0, 5.0]
    members = members_of(Group(6, ("Y",), 1), lookbacks, ["smape"], 2)
    candidates = candidate_members(members, ("smape",), lookbacks, 6)
    assert list(candidates) == ["smape", "smape L=2H", "smape L=2H+3H", "smape L=2H+3H+4H"]
    assert sorted({m.lookback for m in candidates["smape L=2H+3H"]}) == [12, 18]
    assert len(candidates["smape L=2H+3H"]) == 4  # both seeds of each lookback
    for key, chosen in candidates.items():
        assert split_key(key, lookbacks) == (
            "smape",
            lookbacks[: len({m.lookback for m in chosen})],
        )
    # each candidate is evaluated in its own longest member's run
    longest = [max(m.lookback for m in chosen) for chosen in candidates.values()]
    assert len(set(longest)) == len(longest)
    # lookbacks out of order: the first alone would be evaluated where the whole is
    unordered = candidate_members(
        members_of(6, [3.0, 2.0], ["smape"], 1), ("smape",), [3.0, 2.0], 6
    )
    assert list(unordered) == ["smape"]
    # a name that is no run of the lookbacks is a loss's whole ensemble
    assert split_key("smape L=7H", lookbacks) == ("smape L=7H", lookbacks)


def test_a_test_run_trains_the_lookbacks_validation_chose(tmp_path):
    entry = {"loss": "smape", "weight": 1.0, "metric": "smape", "losses": {"smape": 1.0}}
    write_choices(tmp_path, {"4": {**entry, "lookbacks": [2]}, "6": entry}, validation=True)
    choices = read_choices(tmp_path, ["4", "6"], "smape")
    assert choices is not None and choices["4"]["lookbacks"] == [2.0]
    info = None  # not read by lookbacks_of
    plan = Plan("m", tmp_path, CompetitionSpec(), info, tmp_path, [4, 6], None, [], [],  # type: ignore[arg-type]
                choices=choices)  # fmt: skip
    assert plan.lookbacks_of("4", [2.0, 3.0]) == [2.0]
    assert plan.lookbacks_of("6", [2.0, 3.0]) == [2.0, 3.0]  # chosen before lookbacks were
