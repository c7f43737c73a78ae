"""Metrics and naive baselines against values computed by hand."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from metadist.eval import baselines, metrics

# A quarterly history that rises by 1 each year: every seasonal (m=4) difference is 1,
# while the one-step differences are 1, 1, 1, -2 repeated.
QUARTERLY = np.array([1, 2, 3, 4, 2, 3, 4, 5, 3, 4, 5, 6], dtype=np.float64)


def test_mse_mae_by_hand():
    y = np.array([1.0, 2.0, 3.0])
    y_hat = np.array([2.0, 2.0, 1.0])
    assert metrics.mse(y, y_hat) == pytest.approx((1 + 0 + 4) / 3)
    assert metrics.mae(y, y_hat) == pytest.approx((1 + 0 + 2) / 3)


def test_smape_m4_definition_by_hand():
    # 200/h * sum |y - yhat| / (|y| + |yhat|) = 100 * (10/210 + 20/380)
    assert metrics.smape([100.0, 200.0], [110.0, 180.0]) == pytest.approx(
        100 * (10 / 210 + 20 / 380)
    )
    assert metrics.smape([100.0, 200.0], [110.0, 180.0]) == pytest.approx(10.025062656641603)
    # symmetric in its arguments, bounded by 200, a 0/0 term counts as 0
    assert metrics.smape([110.0, 180.0], [100.0, 200.0]) == pytest.approx(10.025062656641603)
    assert metrics.smape([-1.0], [1.0]) == pytest.approx(200.0)
    assert metrics.smape([0.0, 1.0], [0.0, 3.0]) == pytest.approx((0 + 200 * 2 / 4) / 2)


def test_smape_of_a_missing_value_is_missing_not_perfect():
    # a nan forecast (or truth) once scored 0, the best sMAPE there is
    terms = metrics.smape_terms([100.0, 100.0, 0.0], [np.nan, 110.0, 0.0])
    assert np.isnan(terms[0])
    assert terms[1] == pytest.approx(200 * 10 / 210)
    assert terms[2] == 0.0
    assert math.isnan(metrics.smape([100.0, 100.0], [np.nan, 100.0]))
    assert np.isnan(metrics.point_terms("smape", [np.nan], [1.0])[0])


def test_smape_per_axis():
    y = np.array([[100.0, 200.0], [10.0, 10.0]])
    y_hat = np.array([[110.0, 180.0], [10.0, 30.0]])
    per_task = metrics.smape(y, y_hat, axis=1)
    assert per_task == pytest.approx([10.025062656641603, (0 + 200 * 20 / 40) / 2])


def test_mase_with_seasonal_period_by_hand():
    truth = np.array([4.0, 5.0, 6.0, 7.0])
    forecast = np.array([4.0, 4.0, 4.0, 4.0])  # MAE = (0 + 1 + 2 + 3) / 4 = 1.5
    assert metrics.seasonal_scale(QUARTERLY, 4) == pytest.approx(1.0)
    assert metrics.mase(truth, forecast, QUARTERLY, seasonal_period=4) == pytest.approx(1.5)
    # m = 1: the eleven one-step differences sum to 13
    assert metrics.seasonal_scale(QUARTERLY, 1) == pytest.approx(13 / 11)
    assert metrics.mase(truth, forecast, QUARTERLY, seasonal_period=1) == pytest.approx(
        1.5 / (13 / 11)
    )


def test_mase_multi_target_and_degenerate():
    history = np.stack([QUARTERLY, 2 * QUARTERLY], axis=1)  # scales 1 and 2 with m = 4
    truth = np.array([[4.0, 8.0], [5.0, 10.0]])
    forecast = np.array([[3.0, 8.0], [5.0, 6.0]])  # MAE 0.5 and 2.0
    assert metrics.mase(truth, forecast, history, 4) == pytest.approx((0.5 / 1 + 2.0 / 2) / 2)
    assert math.isnan(metrics.mase([1.0], [2.0], [3.0, 3.0, 3.0], 1))
    with pytest.raises(ValueError, match="seasonal_period=4 needs a history longer than 4"):
        metrics.seasonal_scale([1.0, 2.0, 3.0, 4.0], 4)
    with pytest.raises(ValueError, match="seasonal_period must be >= 1"):
        metrics.seasonal_scale(QUARTERLY, 0)


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2,\) and \(3,\)"):
        metrics.mae([1.0, 2.0], [1.0, 2.0, 3.0])


def test_mean_ci_and_accuracy_ci_by_hand():
    mean, half = metrics.mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == pytest.approx(2.5)
    assert half == pytest.approx(1.959963984540054 * math.sqrt(5 / 3) / 2)
    mean, half = metrics.mean_ci([7.0])  # one task: no interval, not an exact "± 0"
    assert mean == 7.0 and math.isnan(half)
    predicted = np.array([[0, 1, 1, 0], [1, 1, 1, 1]])
    target = np.array([[0, 1, 0, 0], [1, 1, 1, 1]])
    accuracy, half = metrics.accuracy_ci(predicted, target)
    assert accuracy == pytest.approx(0.875)
    assert half == pytest.approx(1.959963984540054 * np.std([0.75, 1.0], ddof=1) / math.sqrt(2))
    logits = np.eye(2)[predicted]  # [B, N, C] scores pick the same classes
    assert metrics.accuracy_ci(logits, target)[0] == pytest.approx(0.875)
    with pytest.raises(ValueError, match="not nan"):
        metrics.mean_ci([float("nan")])


def test_pool_weights_points_not_tasks():
    # task 1: 2 points summing to 10, task 2: 8 points summing to 20
    assert metrics.pool([10.0, 20.0], [2, 8]) == pytest.approx(3.0)
    assert metrics.pool([10.0, float("nan")], [2, 8]) == pytest.approx(5.0)


def test_theta_method_by_hand():
    # A straight line: SES follows it with alpha = 1, and Theta adds half the slope per step.
    line = 2.0 * np.arange(10) + 1.0
    np.testing.assert_allclose(baselines.theta_forecast(line, 3, 1), [20.0, 21.0, 22.0])
    # A constant level times seasonal indices: deseasonalised it is constant, so the
    # forecast is the level times the indices that follow.
    indices = np.array([0.8, 1.2, 0.9, 1.1])
    seasonal = 10.0 * indices[np.arange(20) % 4]
    np.testing.assert_allclose(
        baselines.theta_forecast(seasonal, 6, 4), 10.0 * indices[[0, 1, 2, 3, 0, 1]]
    )
    # ... which the non-seasonal method (m = 1) cannot do
    plain = baselines.theta_forecast(seasonal, 6, 1)
    assert np.abs(plain - 10.0 * indices[[0, 1, 2, 3, 0, 1]]).max() > 1.0
    np.testing.assert_allclose(baselines.theta_forecast(np.full(30, 5.0), 4, 12), 5.0)
    assert baselines.theta_forecast([7.0], 3, 1).tolist() == [7.0, 7.0, 7.0]
    two = baselines.theta_forecast(np.stack([line, 2 * line], axis=1), 2, 1)
    np.testing.assert_allclose(two, [[20.0, 40.0], [21.0, 42.0]])
    with pytest.raises(ValueError, match="seasonal_period must be >= 1"):
        baselines.theta_forecast(line, 2, 0)


def test_theta_smoothing_minimises_the_one_step_errors():
    rng = np.random.default_rng(4)
    y = 50.0 + np.cumsum(rng.normal(size=40)) + rng.normal(scale=2.0, size=40)
    level, alpha = baselines._ses(y)

    def sse_and_level(a, level0):
        errors, current = [], level0
        for value in y:
            errors.append(value - current)
            current = a * value + (1 - a) * current
        return float(np.sum(np.square(errors))), current

    best = min(
        (sse_and_level(a, l0)[0], a, l0)
        for a in baselines._SES_ALPHAS
        for l0 in np.linspace(y[0] - 10, y[0] + 10, 401)
    )
    assert alpha == pytest.approx(best[1])
    assert sse_and_level(alpha, best[2])[1] == pytest.approx(level, abs=0.05)
    slope = np.polyfit(np.arange(40), y, 1)[0]
    drift = (1 - (1 - alpha) ** 40) / alpha
    np.testing.assert_allclose(
        baselines.theta_forecast(y, 3, 1), level + slope / 2 * (np.arange(3) + drift)
    )


def test_naive_and_seasonal_naive_by_hand():
    assert baselines.naive_forecast(QUARTERLY, 3).tolist() == [6.0, 6.0, 6.0]
    assert baselines.seasonal_naive_forecast(QUARTERLY, 6, 4).tolist() == [3, 4, 5, 6, 3, 4]
    assert baselines.seasonal_naive_forecast(QUARTERLY, 2, 1).tolist() == [6.0, 6.0]
    # shorter than a season: falls back to the last value
    assert baselines.seasonal_naive_forecast([1.0, 2.0], 3, 4).tolist() == [2.0, 2.0, 2.0]
    two_columns = np.stack([QUARTERLY, -QUARTERLY], axis=1)
    assert baselines.seasonal_naive_forecast(two_columns, 5, 4)[:, 1].tolist() == [
        -3,
        -4,
        -5,
        -6,
        -3,
    ]
    with pytest.raises(ValueError, match="at least one value"):
        baselines.naive_forecast([], 2)


def test_from_scratch_fits_each_task_separately():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    initial = model[0].weight.detach().clone()
    x = torch.linspace(-1, 1, 8).reshape(1, 8, 1).repeat(2, 1, 1)
    y = torch.stack([2 * x[0] + 1, -3 * x[1]])  # two different lines
    params = baselines.fit_from_scratch(model, x, y, steps=300, lr=0.02)
    assert params["0.weight"].shape == (2, 16, 1)
    fit = baselines.predict_stacked(model, params, x)
    per_task_mse = ((fit - y) ** 2).mean(dim=(1, 2))
    assert torch.all(per_task_mse < 1e-2)
    # the two tasks got different weights, and the model itself was left untouched
    assert not torch.allclose(params["2.weight"][0], params["2.weight"][1])
    assert torch.equal(model[0].weight, initial)
    unfitted = baselines.fit_from_scratch(model, x, y, steps=0, lr=0.02)
    assert torch.equal(unfitted["0.weight"][1], initial)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        baselines.fit_from_scratch(model, x, y, steps=-1, lr=0.1)


class _DataDependent(nn.Module):
    """Python control flow on a tensor value: vmap cannot batch it."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(5, 1)

    def forward(self, x):  # [N, L, 1] -> [N, 1]
        if x.abs().max().item() > 1e6:
            raise AssertionError("unreachable for these inputs")
        return self.head(x.squeeze(-1))


def test_from_scratch_falls_back_to_a_task_loop_when_vmap_cannot_batch(capsys):
    torch.manual_seed(0)
    model = _DataDependent()
    x = torch.randn(3, 4, 5, 1)
    y = x.sum(dim=2)  # [B, K, 1]
    params = baselines.fit_from_scratch(model, x, y, steps=2, lr=0.01)
    assert "training per task in a loop" in capsys.readouterr().err
    assert params["head.weight"].shape == (3, 1, 5)
    out = baselines.predict_stacked(model, params, x)
    assert out.shape == (3, 4, 1)
    expected = torch.func.functional_call(model, {k: v[1] for k, v in params.items()}, (x[1],))
    torch.testing.assert_close(out[1], expected)


# ---------------------------------------------------------------- competition metrics
def test_mape_against_hand_values_and_undefined_at_zero():
    from metadist.eval.metrics import ape_terms, mape

    assert mape([100.0, 200.0], [110.0, 180.0]) == pytest.approx(10.0)
    assert mape([-50.0], [-40.0]) == pytest.approx(20.0)
    terms = ape_terms([0.0, 4.0], [1.0, 3.0])
    assert np.isnan(terms[0]) and terms[1] == pytest.approx(25.0)


def test_owa_and_per_series_means_against_hand_values():
    from metadist.eval.scoring import TaskScores

    scores = TaskScores(["model", "naive2"], ["smape", "mase"])
    # task 1: 2 points, task 2: 4 points; sums of the point-wise terms
    scores.add(
        {"model": {"smape": 10.0, "mase": 1.0}, "naive2": {"smape": 20.0, "mase": 4.0}}, 2, {}
    )
    scores.add(
        {"model": {"smape": 8.0, "mase": 4.0}, "naive2": {"smape": 40.0, "mase": 4.0}}, 4, {}
    )
    summary = scores.summary()
    # pooled over the 6 points: model sMAPE 18/6 = 3, MASE 5/6; naive 2: 60/6 = 10, 8/6
    assert summary["model"]["smape"]["value"] == pytest.approx(3.0)
    assert summary["naive2"]["mase"]["value"] == pytest.approx(8 / 6)
    # per-series means: model sMAPE (10/2 + 8/4)/2 = 3.5, naive 2 (10 + 10)/2 = 10
    assert summary["model"]["smape"]["task_mean"] == pytest.approx(3.5)
    assert summary["naive2"]["smape"]["task_mean"] == pytest.approx(10.0)
    owa = summary["model"]["owa"]
    assert owa["value"] == pytest.approx(0.5 * (3.0 / 10.0 + (5 / 6) / (8 / 6)))
    # per series: MASE model (0.5 + 1)/2 = 0.75, naive 2 (2 + 1)/2 = 1.5
    assert owa["task_mean"] == pytest.approx(0.5 * (3.5 / 10.0 + 0.75 / 1.5))
    assert summary["naive2"]["owa"]["value"] == pytest.approx(1.0)
    # a diverged task makes the model's OWA not a number, never an average of the rest
    scores.add(
        {"model": {"smape": 1.0, "mase": 1.0}, "naive2": {"smape": 1.0, "mase": 1.0}},
        1,
        {},
        {"model": True},
    )
    assert np.isnan(scores.summary()["model"]["owa"]["value"])
    assert TaskScores(["model"], ["smape", "mase"]).has_owa is False
