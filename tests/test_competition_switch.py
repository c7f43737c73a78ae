"""`metadist competition --experiment-margin`: another experiment replaces the best of
the run's own in a group only where it wins by more than that many standard errors of
the paired difference between the series; recorded in choices.json and printed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from competition_data import write_yearly_history

from metadist.commands.competition.candidates import choose
from metadist.commands.competition.choice import describe
from metadist.commands.competition.cli import build_parser, main
from metadist.commands.competition.switch import (
    DEFAULT_MARGIN,
    paired_difference,
    switch_test,
    task_sums,
)
from metadist.eval.fallback_combination import pooled_score
from metadist.eval.metrics import point_terms

SERIES, STEPS = 40, 4
MLP = "competition_cpu_mlp"


def _truth(seed: int = 0) -> np.ndarray:
    return 10.0 + np.random.default_rng(seed).uniform(0.0, 5.0, (SERIES, STEPS))


def _run(run: Path, truth: np.ndarray, model: np.ndarray) -> Path:
    """A fake evaluated run of `SERIES` yearly series of `STEPS` points: the model's
    forecasts `model` of `truth`, scored by MAPE as the pooled points score it."""
    (run / "eval").mkdir(parents=True)
    entities = [f"s{k:02d}" for k in range(SERIES)]
    write_yearly_history(run, {e: [10.0 + (t % 3) for t in range(6)] for e in entities})
    points = pd.DataFrame(
        {
            "frequency": "yearly",
            "entity": np.repeat(entities, STEPS),
            "step": np.tile(np.arange(STEPS), SERIES),
            "truth": truth.ravel(),
            "adapted": model.ravel(),
            "unadapted": model.ravel(),
            "seasonal_naive": truth.ravel() * 1.2,
        }
    )
    points.to_parquet(run / "eval" / "forecasts.parquet")
    tasks = pd.DataFrame(
        {"group:entity": entities, "seasonal_naive:mae": 2.0, "seasonal_naive:mase": 1.0}
    )
    tasks.to_parquet(run / "eval" / "tasks.parquet")
    score = pooled_score(point_terms("mape", truth, model).ravel(), points["entity"].to_numpy())
    overall = {m: {"mape": {"value": score}} for m in ("adapted", "unadapted")}
    (run / "eval" / "metrics.json").write_text(
        json.dumps({"primary_metric": "mape", "overall": overall})
    )
    return run


def _errors(seed: int, bias: float, spread: float) -> np.ndarray:
    """Relative errors of mean `bias` and per-series spread `spread`."""
    rng = np.random.default_rng(seed)
    per_series = rng.normal(0.0, spread, (SERIES, 1))
    return np.abs(bias + per_series + rng.normal(0.0, 0.01, (SERIES, STEPS)))


def _close(errors: np.ndarray) -> np.ndarray:
    """`errors` better by 0.2 points in all, by ± 3 points series by series."""
    signs = np.where(np.arange(SERIES) % 2 == 0, 1.0, -1.0)[:, None]
    return errors - 0.002 + 0.03 * signs


def test_the_paired_difference_is_the_pooled_scores_difference_with_its_error():
    own = {f"s{k}": (float(v), 4) for k, v in enumerate([8.0, 4.0, 6.0, 10.0])}
    other = {f"s{k}": (float(v), 4) for k, v in enumerate([6.0, 4.0, 2.0, 8.0, 1.0])}
    difference, error, tasks = paired_difference(own, other)
    diffs = np.array([2.0, 0.0, 4.0, 2.0]) / 4  # per point, the tasks both score
    assert tasks == 4
    assert difference == pytest.approx(diffs.mean())
    assert error == pytest.approx(diffs.std(ddof=1) / np.sqrt(4))
    # a task of more points weighs more: the pooled difference
    unequal = {"a": (6.0, 2), "b": (0.0, 6)}
    assert paired_difference(unequal, {"a": (2.0, 2), "b": (0.0, 6)})[0] == pytest.approx(0.5)
    assert np.isnan(paired_difference({"a": (1.0, 2)}, {"a": (0.0, 2)})[1])
    nothing = paired_difference({"a": (1.0, 2)}, {"b": (0.0, 2)})
    assert nothing[2] == 0 and np.isnan(nothing[0]) and np.isnan(nothing[1])


def test_the_difference_is_of_the_pooled_scores_where_the_counts_differ():
    # both score 5 a point: no difference, however the points are counted
    own = {"a": (10.0, 2), "b": (10.0, 2)}
    other = {"a": (15.0, 3), "b": (15.0, 3)}
    difference, error, _ = paired_difference(own, other)
    assert difference == pytest.approx(0.0) and error == pytest.approx(0.0)
    other = {"a": (9.0, 3), "b": (21.0, 3)}  # 3 and 7 a point: 5 pooled
    assert paired_difference(own, other)[0] == pytest.approx(0.0)
    assert paired_difference(own, other)[1] > 0


def test_task_sums_leave_out_a_task_with_an_undefined_term(tmp_path):
    truth = _truth()
    truth[3, 1] = 0.0  # MAPE undefined there
    sums = task_sums(_run(tmp_path / "r", truth, truth * 1.1), "adapted", "mape")
    assert len(sums) == SERIES - 1 and "s03" not in sums
    assert sums["s00"] == (pytest.approx(40.0), STEPS)


def _own_and_close(tmp_path: Path) -> tuple[np.ndarray, Path, Path]:
    """`(truth, own, close)`: the runs of a model and of one a little better in all, by
    much less than its spread over the series."""
    truth = _truth()
    errors = _errors(1, 0.10, 0.02)
    own = _run(tmp_path / "own", truth, truth * (1 + errors))
    return truth, own, _run(tmp_path / "close", truth, truth * (1 + _close(errors)))


def test_a_clear_win_switches_and_a_margin_inside_the_noise_keeps_the_runs_own(tmp_path):
    truth, own, close = _own_and_close(tmp_path)
    clear = _run(tmp_path / "clear", truth, truth * (1 + _errors(2, 0.05, 0.02)))
    won = switch_test((own, "adapted"), (clear, "adapted"), "mape", DEFAULT_MARGIN)
    assert won["switched"] and won["difference"] > DEFAULT_MARGIN * won["standard_error"] > 0
    lost = switch_test((own, "adapted"), (close, "adapted"), "mape", DEFAULT_MARGIN)
    assert 0 < lost["difference"] < DEFAULT_MARGIN * lost["standard_error"]
    assert not lost["switched"]
    assert switch_test((own, "adapted"), (close, "adapted"), "mape", 0.0)["switched"]


def test_the_group_choice_tests_the_other_experiment_and_records_it(tmp_path):
    truth, own, other = _own_and_close(tmp_path)
    shorter = _run(tmp_path / "short", truth, truth * (1 + _errors(4, 0.12, 0.02)))
    runs = {"mape": own, "mape S=10": shorter, f"mape experiment={MLP}": other}
    kept_run, kept = choose(runs, [2.0], DEFAULT_MARGIN)
    assert kept_run == own and kept["loss"] == "mape" and kept["experiment"] is None
    test = kept["switch"]
    assert test["candidate"] == f"mape experiment={MLP}" and test["against"] == "mape"
    assert test["switched"] is False and test["num_series"] == SERIES
    # the difference tested is that of the two validation scores
    assert test["difference"] == pytest.approx(
        kept["losses"]["mape"] - kept["losses"][f"mape experiment={MLP}"]
    )
    assert "the run's own kept" in describe("4", kept)
    # margin 0: the lowest score, as every other candidate
    taken_run, taken = choose(runs, [2.0], 0.0)
    assert taken_run == other and taken["experiment"] == MLP and taken["switch"] is None
    # a clear win switches, and says so
    runs[f"mape experiment={MLP}"] = _run(
        tmp_path / "clear", truth, truth * (1 + _errors(2, 0.05, 0.02))
    )
    switched_run, switched = choose(runs, [2.0], DEFAULT_MARGIN)
    assert switched_run == tmp_path / "clear"
    assert switched["experiment"] == MLP and switched["switch"]["switched"] is True
    assert describe("4", switched).endswith("margin 2): chosen")
    # no other experiment better by score: no test
    runs[f"mape experiment={MLP}"] = shorter
    assert choose(runs, [2.0], DEFAULT_MARGIN)[1]["switch"] is None


def test_one_series_in_common_gives_no_error_to_switch_by():
    test = paired_difference({"a": (9.0, 4)}, {"a": (1.0, 4)})
    assert test[0] == 2.0 and np.isnan(test[1])  # a win, with no error to judge it by


def test_another_experiment_is_taken_where_none_of_the_runs_own_scores(tmp_path):
    truth = _truth()
    errors = _errors(1, 0.10, 0.02)
    broken = _run(tmp_path / "own", truth, np.full_like(truth, np.nan))
    other = _run(tmp_path / "other", truth, truth * (1 + _close(errors)))
    run, entry = choose({"mape": broken, f"mape experiment={MLP}": other}, [2.0], 2.0)
    assert run == other and entry["experiment"] == MLP and entry["switch"] is None


def test_the_margin_is_two_standard_errors_unless_given():
    assert build_parser().parse_args(["d"]).experiment_margin == DEFAULT_MARGIN == 2.0
    assert build_parser().parse_args(["d", "--experiment-margin", "0"]).experiment_margin == 0


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "two"])
def test_a_bad_margin_is_named_in_one_line(tmp_path, capsys, value):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--experiment-margin", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1  # the line alone, not argparse's usage block before it
    assert err[0].startswith(f"metadist competition: error: argument --experiment-margin: "
                             f"{value!r} is not a number of standard errors >= 0")  # fmt: skip
