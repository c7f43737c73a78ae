"""The plausibility band of a forecast (`metadist.eval.plausibility`): built from the
series' own growth over one season, its width chosen on validation forecasts."""

from __future__ import annotations

import numpy as np
import pytest

from metadist.eval.plausibility import (
    WIDTHS,
    band,
    fit_width,
    growth_rates,
    guard,
    guard_points,
    parse_width,
    width_label,
)


def test_growth_is_log_ratios_of_a_positive_history_else_differences():
    rates, relative = growth_rates(np.array([1.0, 2.0, 4.0, 2.0]), 1)
    assert relative and np.allclose(rates, np.log([2.0, 2.0, 0.5]))
    rates, relative = growth_rates(np.array([0.0, 3.0, 1.0, 5.0]), 2)
    assert not relative and rates.tolist() == [1.0, 2.0]
    assert len(growth_rates(np.ones(4), 4)[0]) == 0
    with pytest.raises(ValueError, match="period must be an integer >= 1"):
        growth_rates(np.ones(4), 0)
    with pytest.raises(ValueError, match="every value must be finite"):
        growth_rates(np.array([1.0, np.nan]), 1)


def test_the_band_is_tukeys_fences_of_growth_compounded_from_seasonal_naive():
    # yearly growth 10 % every year: quartiles equal, any width gives exactly that growth
    history = 100.0 * 1.1 ** np.arange(6)
    lower, upper = band(history, 3, 1, 1.0)
    expected = history[-1] * 1.1 ** np.arange(1, 4)
    assert np.allclose(lower, expected) and np.allclose(upper, expected)
    # growth rates log 2 and 0 (twice each): Q1 = 0, Q3 = log 2, IQR = log 2
    history = np.array([1.0, 2.0, 2.0, 4.0, 4.0])
    lower, upper = band(history, 2, 1, 0.5)
    assert np.allclose(lower, 4.0 * np.exp(-0.5 * np.log(2) * np.array([1, 2])))
    assert np.allclose(upper, 4.0 * np.exp(1.5 * np.log(2) * np.array([1, 2])))


def test_a_seasonal_band_starts_from_the_same_phase_of_the_last_season():
    season = np.array([10.0, 20.0, 30.0, 40.0])
    history = np.concatenate([season, season, season])  # no growth at all
    lower, upper = band(history, 6, 4, 3.0)
    assert np.allclose(lower, [10, 20, 30, 40, 10, 20]) and np.allclose(upper, lower)
    # with zeros, growth adds up: +5 each season, steps 5..6 are two seasons ahead
    history = np.concatenate([season - 10, season - 5, season])
    lower, upper = band(history, 6, 4, 0.0)
    assert np.allclose(lower, [15, 25, 35, 45, 20, 30]) and np.allclose(upper, lower)


def test_no_guard_and_too_short_histories_leave_the_forecast_alone():
    forecast = np.array([1e9, -1e9])
    assert guard(forecast, np.arange(1.0, 6.0), 1, None).tolist() == forecast.tolist()
    assert guard(forecast, np.array([3.0, 4.0]), 4, 0.0).tolist() == forecast.tolist()
    lower, upper = band(np.array([3.0]), 2, 1, 1.0)
    assert np.isneginf(lower).all() and np.isposinf(upper).all()
    with pytest.raises(ValueError, match="width must be None or a finite number >= 0"):
        band(np.ones(5), 2, 1, -1.0)
    with pytest.raises(ValueError, match="horizon must be an integer >= 1"):
        band(np.ones(5), 0, 1, 1.0)


def test_a_rebound_beyond_the_historys_growth_is_clipped_and_nan_kept():
    history = np.array([100.0, 102.0, 104.0, 106.0, 108.0, 60.0])  # a steep fall at the end
    lower, upper = band(history, 3, 1, 1.0)
    inside = (lower[1] + upper[1]) / 2
    guarded = guard(np.array([120.0, inside, np.nan]), history, 1, 1.0)
    assert guarded[0] == pytest.approx(upper[0]) and upper[0] < 62.0  # growth ~2 % a year
    assert guarded[1] == inside and np.isnan(guarded[2])


def test_points_are_guarded_series_by_series():
    histories = {"a": np.full(5, 10.0), "b": np.full(5, 20.0)}
    model = np.array([15.0, 5.0, 15.0, 25.0])
    tasks = np.array(["a", "a", "b", "b"])
    assert guard_points(model, tasks, histories, 1, 0.0).tolist() == [10.0, 10.0, 20.0, 20.0]
    assert guard_points(model, tasks, histories, 1, None).tolist() == model.tolist()
    with pytest.raises(ValueError, match="series 'b' has no history"):
        guard_points(model, tasks, {"a": histories["a"]}, 1, 0.0)


def test_the_width_is_chosen_by_the_validation_score():
    histories = {"a": 100.0 * 1.1 ** np.arange(8), "b": 50.0 * 1.1 ** np.arange(8)}
    tasks = np.array(["a", "a", "b", "b"])
    truth = np.concatenate([h[-1] * 1.1 ** np.arange(1, 3) for h in histories.values()])
    # a model far off the history's steady growth: the tightest band is exactly right
    width, scores = fit_width("mape", truth, truth * 2.0, tasks, histories, 1)
    assert width == 0.0 and scores["0"] == pytest.approx(0.0) and scores["none"] > 90
    assert set(scores) == {width_label(w) for w in WIDTHS}
    # a right model: every band ties, the widest (no guard) wins
    assert fit_width("mape", truth, truth, tasks, histories, 1)[0] is None
    with pytest.raises(ValueError, match="differ in length"):
        fit_width("mape", truth, truth[:2], tasks, histories, 1)


def test_width_labels_round_trip():
    for width in WIDTHS:
        assert parse_width(width_label(width)) == width
    assert parse_width(None) is None
    with pytest.raises(ValueError, match="guard width must be 'none' or a number >= 0"):
        parse_width("wide")
    with pytest.raises(ValueError, match="guard width"):
        parse_width(-1)
