"""Evaluation settings that only forecasting reads, met by a few-shot classification run:
a forecast baseline asked for is refused in one line before any work, per-group tables
and the forecast figure are named in a note (they were dropped without a word)."""

from __future__ import annotations

import shutil

import pytest
from tiny_runs import train_tiny, ucr_store

from metadist.cli import main
from metadist.eval.settings import EvalOptions
from metadist.train.compose import compose_dict

SET = "UnitTest"  # 42 cases, 2 classes


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forecast-only")
    store = ucr_store(tmp, SET)
    return train_tiny(store, tmp / "run", "experiment=ucr_protonet")


def _eval(run_dir, capsys, *overrides: str) -> tuple[int, str]:
    code = main(
        ["eval", f"run_dir={run_dir}", "eval.max_tasks=4", "eval.scratch_steps=1",
         "eval.pretrain_steps=1", "--no-shared-cache", *overrides]
    )  # fmt: skip
    return code, capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_per_group_tables_and_examples_are_noted_as_not_applying(run_dir, capsys):
    code, err = _eval(run_dir, capsys, "eval.group_by=[label]", "eval.num_examples=3")
    assert code == 0, err
    assert (
        "note: eval.group_by=[label] does not apply to few-shot classification (an episode "
        "draws several classes, so it has no one stratum or label): no per-group tables; "
        "set it to [] for this experiment"
    ) in err
    assert (
        "note: eval.num_examples=3 does not apply to few-shot classification: it is the "
        "number of forecasts drawn in the figure; set it to 0 for this experiment"
    ) in err
    # the experiment's own settings ask for neither: no note
    code, err = _eval(run_dir, capsys)
    assert code == 0, err
    assert "does not apply" not in err


REFUSED = {
    "eval.extra_baselines=[ets]": "eval.extra_baselines=[ets] are forecast baselines, so they "
    "need forecast tasks on a store; set it to [] for this experiment",
    "eval.combinations=[[adapted,naive]]": "eval.combinations averages forecasts in original "
    "units, so it needs forecast tasks on a store; set it to null for this experiment",
    "eval.learned_combination=[adapted,naive]": "eval.learned_combination weighs forecasts in "
    "original units, so it needs forecast tasks on a store; set it to null for this experiment",
}


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("override", sorted(REFUSED))
def test_a_forecasting_method_is_refused_before_any_work(run_dir, tmp_path, capsys, override):
    fresh = tmp_path / "run"
    shutil.copytree(run_dir, fresh, ignore=shutil.ignore_patterns("eval"))
    code, err = _eval(fresh, capsys, override)
    assert code == 1, err
    assert err.strip().splitlines() == [f"metadist eval: error: {REFUSED[override]}"]
    assert not (fresh / "eval").exists()  # no baseline trained, no report written


def test_the_shipped_classification_experiments_ask_for_no_forecasting_setting():
    from metadist.eval.forecast_only import check_forecast_only

    for experiment in ("synthetic_protonet", "ucr_protonet", "ucr_maml"):
        options = EvalOptions.from_dict(compose_dict([f"experiment={experiment}"])["eval"])
        assert check_forecast_only(options, "classification") == [], experiment


def test_forecasting_settings_of_regression_tasks_are_noted_and_forecasts_keep_them():
    from metadist.eval.forecast_only import check_forecast_only

    options = EvalOptions.from_dict({"group_by": ["stratum"], "num_examples": 2})
    notes = check_forecast_only(options, "regression")
    assert [n.split(" does not apply")[0] for n in notes] == [
        "note: eval.group_by=[stratum]",
        "note: eval.num_examples=2",
    ]
    assert check_forecast_only(options, "forecast") == []
    with pytest.raises(ValueError, match=r"^eval.combinations averages forecasts"):
        check_forecast_only(
            EvalOptions.from_dict({"combinations": [["adapted", "naive"]]}), "regression"
        )
