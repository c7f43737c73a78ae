"""The learned (FFORMA-style) forecast combination: features, the weight model, and its
place in forecast scoring (weights from validation windows only)."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from metadist.commands.competition.evaluation import learned_candidates
from metadist.datasets.synthetic import (
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_PERIODS,
    write_synthetic_panel,
)
from metadist.eval import EvalOptions, evaluate_tasks
from metadist.eval.combination_loss import CombinedLoss
from metadist.eval.forecast_scoring import ForecastScorer
from metadist.eval.learned_combination import (
    fit_weight_model,
    relative_errors,
    weighted_forecast,
)
from metadist.eval.predictions import model_predictions
from metadist.eval.series_features import FEATURE_NAMES, features_of, series_features
from metadist.eval.settings import load_eval_options
from metadist.eval.statistical import StatisticalForecasts, statistical_forecasts
from metadist.eval.task_scores import TaskScores
from metadist.eval.validation_window import model_validation_batch, validation_histories
from metadist.learners import build_learner
from metadist.models import build_model
from metadist.store.ingest import ingest
from metadist.tasks import build_task_sampler
from metadist.tasks.inference import forecast_windows

LOOKBACK, HORIZON = 16, 4
CANDIDATES = ["adapted", "theta", "seasonal_naive", "naive"]


@pytest.mark.parametrize(
    "series",
    [[5.0], [2.0, 2.0], np.full(40, 7.0), np.zeros(30), [1.0, -1.0, 1e9], np.arange(3.0)],
)
@pytest.mark.parametrize("period", [1, 4, 12])
def test_features_are_finite_for_short_and_degenerate_series(series, period):
    features = series_features(np.asarray(series), period)
    assert features.shape == (len(FEATURE_NAMES),)
    assert np.isfinite(features).all()


def test_features_tell_seasonal_from_trending_series():
    t = np.arange(96.0)
    seasonal = 10 + np.sin(2 * np.pi * t / 12)
    trending = 10 + 0.5 * t
    names = list(FEATURE_NAMES)
    season, trend = features_of([seasonal, trending], [12, 12])
    assert season[names.index("seasonal_strength")] > 0.9
    assert trend[names.index("seasonal_strength")] < 0.1
    assert trend[names.index("trend_strength")] > 0.9
    assert series_features(np.full(10, 3.0), 4)[names.index("constant")] == 1.0
    with pytest.raises(ValueError, match="period"):
        series_features(seasonal, 0)


def test_weight_model_follows_the_feature_that_decides_the_best_method():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(200, 3))
    # method 0 is best where feature 0 > 0, method 1 elsewhere; method 2 never
    errors = np.where(features[:, :1] > 0, [0.2, 1.5, 2.0], [1.5, 0.2, 2.0])
    model = fit_weight_model(features, errors, seed=0)
    weights = model.weights(features)
    assert np.allclose(weights.sum(axis=1), 1.0)
    positive = features[:, 0] > 0.5
    negative = features[:, 0] < -0.5
    assert weights[positive, 0].mean() > 0.8
    assert weights[negative, 1].mean() > 0.8
    assert weights[:, 2].mean() < 0.05
    assert model.penalty < np.inf  # the features help on the held-out series
    with pytest.raises(ValueError, match="features"):
        fit_weight_model(features, errors[:5])


def test_weight_model_without_series_weighs_alike():
    model = fit_weight_model(np.zeros((0, 4)), np.zeros((0, 3)))
    assert np.allclose(model.weights(np.ones((2, 4))), 1 / 3)
    few = fit_weight_model(np.ones((3, 4)), np.array([[1.0, 2.0, 3.0]] * 3))
    assert few.penalty == np.inf  # too few for a split: one learned weight vector
    assert few.weights(np.zeros((1, 4)))[0].argmax() == 0


def test_relative_errors_and_weighted_forecast_handle_bad_forecasts():
    truth = np.ones((2, 3, 1))
    forecasts = np.stack([np.ones((2, 3, 1)), np.full((2, 3, 1), 2.0)], axis=1)
    forecasts[1, 1] = np.nan  # method 1 fails on series 1
    errors = relative_errors(truth, forecasts, np.array([[1.0], [np.nan]]))
    assert np.isfinite(errors).all()
    assert errors[0, 0] < errors[0, 1]
    assert errors[1, 1] == errors.max()
    combined = weighted_forecast(forecasts, np.array([[0.5, 0.5], [0.5, 0.5]]))
    np.testing.assert_allclose(combined[0], 1.5)
    # the failed method is not quietly left out: the series' combination diverged
    assert np.isnan(combined[1]).all()
    # a method of weight 0 does not count
    np.testing.assert_allclose(weighted_forecast(forecasts, np.array([[1.0, 0], [1, 0]])), 1.0)
    constant = relative_errors(truth, np.ones((2, 2, 3, 1)), np.zeros((2, 1)))
    np.testing.assert_allclose(constant, 1.0)  # every method perfect: no preference


def _panel(rng, num):
    """Half strongly seasonal series (naive far worst), half random walks (naive best)."""
    series, kinds = [], []
    for i in range(num):
        t = np.arange(60.0)
        if i % 2:
            y = 50 + 20 * np.sign(np.sin(2 * np.pi * (t + 0.5) / 4)) + rng.normal(0, 0.3, 60)
        else:
            y = 50 + np.cumsum(rng.normal(0, 3, 60))
        series.append(y[:, None])
        kinds.append(i % 2)
    return series, np.array(kinds)


def test_learned_weights_favour_the_best_method_per_series_type_and_beat_the_mean():
    rng = np.random.default_rng(1)
    methods = ["theta", "seasonal_naive", "naive"]
    series, kinds = _panel(rng, 120)
    histories = [s[:-HORIZON] for s in series]  # the evaluated horizon is cut off first
    shortened, truth, usable = validation_histories(histories, HORIZON)
    assert usable.all()
    valid = [statistical_forecasts(h, HORIZON, 4, []) for h in shortened]
    stacked = np.stack([np.stack([f[m] for m in methods]) for f in valid])
    scale = np.stack([np.abs(h[4:] - h[:-4]).mean(axis=0) for h in shortened])
    model = fit_weight_model(
        features_of(shortened, [4] * 120), relative_errors(truth, stacked, scale)
    )
    weights = model.weights(features_of(histories, [4] * 120))
    # naive is far worst on the seasonal series and best on the random walks
    assert weights[kinds == 1, 2].mean() < 0.05
    assert weights[kinds == 0, 2].mean() > 0.6
    test = [statistical_forecasts(h, HORIZON, 4, []) for h in histories]
    forecasts = np.stack([np.stack([f[m] for m in methods]) for f in test])
    actual = np.stack([s[-HORIZON:] for s in series])

    def smape(forecast):
        return float(np.mean(200 * np.abs(actual - forecast) / (np.abs(actual) + np.abs(forecast))))

    assert smape(weighted_forecast(forecasts, weights)) < 0.8 * smape(forecasts.mean(axis=1))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("fforma")
    write_synthetic_panel(
        root / "panel", num_entities=16, length_range=(100, 140), seed=3, nan_fraction=0.0
    )
    return ingest(root / "panel", root / "store", progress=False, **SYNTHETIC_INGEST_ARGS)


def _setup(store):
    sampler = build_task_sampler(
        "forecast",
        store,
        lookback=LOOKBACK,
        horizon=HORIZON,
        num_support=3,
        num_query=1,
        split="end",
    )
    torch.manual_seed(0)
    model = build_model(
        "forecaster", (LOOKBACK, store.num_columns), (HORIZON, 1), hidden_sizes=(16,)
    )
    learner = build_learner("maml", model, inner_steps=1, inner_lr=0.05, eval_inner_steps=3)
    units = np.arange(sampler.num_units)
    batches = [sampler.sample(u, u.astype(np.uint64)) for u in (units[:9], units[9:])]
    options = EvalOptions(
        seasonal_period=dict(SYNTHETIC_PERIODS), scratch_steps=0, learned_combination=CANDIDATES
    )
    return sampler, learner, batches, options


def test_learned_combination_is_scored_as_a_method_of_its_own(store):
    sampler, learner, batches, options = _setup(store)
    result, _ = evaluate_tasks(
        learner,
        batches,
        options=options,
        store=store,
        target_columns=sampler.target_columns,
        windows=forecast_windows(sampler, store.num_columns),
    )
    assert "fforma" in result["methods"] and "adapted" in result["methods"]
    assert np.isfinite(result["overall"]["fforma"]["smape"]["value"])
    fit = result["settings"]["learned_combination"]
    assert fit["candidates"] == CANDIDATES
    assert fit["validation_series"] == 16
    with pytest.raises(ValueError, match="ets"):
        evaluate_tasks(
            learner,
            batches,
            options=dataclasses.replace(options, learned_combination=["theta", "ets"]),
            store=store,
            target_columns=sampler.target_columns,
        )


def _scored(store, learner, batches, options, windows, sampler_columns):
    """The scorer's fitted weight model and learned forecasts after scoring `batches`."""
    options = dataclasses.replace(options, num_examples=0)
    scorer = ForecastScorer(
        store,
        sampler_columns,
        options,
        ["naive"],
        StatisticalForecasts([], workers=1),
        learner,
        windows,
    )
    scores = TaskScores(["adapted", "theta", "fforma"], ["smape"])
    for batch in batches:
        scorer.start(batch)
    for batch in batches:
        predictions = model_predictions(learner, batch, options, unadapted=False)
        scorer(scores, batch, {"adapted": predictions["adapted"].numpy()})
    scorer.finish()
    return scorer.learned.model, scores


def test_weights_come_only_from_the_validation_windows(store):
    sampler, learner, batches, options = _setup(store)
    windows = forecast_windows(sampler, store.num_columns)
    model, scores = _scored(store, learner, batches, options, windows, sampler.target_columns)
    changed = [
        dataclasses.replace(b, query=dataclasses.replace(b.query, y=b.query.y * 3 + 7))
        for b in batches
    ]
    again, other = _scored(store, learner, changed, options, windows, sampler.target_columns)
    np.testing.assert_array_equal(model.coef, again.coef)  # the horizon's values unread
    assert other.num_tasks == scores.num_tasks == 16
    # the validation window is the history's last H points, never the query's
    batch, rows = model_validation_batch(store, windows, [0], [len(store.series(0)) - 1], HORIZON)
    assert rows.all()
    expected = store.series(0)[len(store.series(0)) - 1 - HORIZON : -1, sampler.target_columns]
    np.testing.assert_array_equal(batch.query.y[0, 0].numpy(), expected)
    assert batch.support.y.shape[1:] == (3, HORIZON, 1)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("theta", "must be a list"),
        (["theta"], "two or more"),
        (["fforma", "theta"], "unknown method 'fforma'"),
        (["theta", "theta"], "two or more different"),
    ],
)
def test_bad_learned_combinations_name_the_field(value, message):
    with pytest.raises(ValueError, match=message) as error:
        EvalOptions.from_dict({"learned_combination": value})
    assert "eval.learned_combination" in str(error.value)


def test_the_competition_scores_the_learned_combination_of_its_methods():
    assert learned_candidates(ets=True) == ["adapted", "theta", "ets", "seasonal_naive", "naive"]
    assert "ets" not in learned_candidates(ets=False)
    override = f"eval.learned_combination={json.dumps(learned_candidates(False))}"
    options = load_eval_options("none", [override], recorded={"split": "all"})
    assert options.learned_combination == learned_candidates(False)


def test_the_combined_forecast_loss_has_the_gradient_of_its_value():
    rng = np.random.default_rng(0)
    truth = rng.normal(5, 1, (6, 4, 1))
    forecasts = rng.normal(5, 2, (6, 3, 4, 1))
    loss = CombinedLoss(truth, forecasts, np.abs(rng.normal(1, 0.2, (6, 1))))
    weights = rng.dirichlet(np.ones(3), 6)
    value, grad = loss(weights)
    numeric = np.zeros_like(weights)
    for i, m in np.ndindex(*weights.shape):
        moved = weights.copy()
        moved[i, m] += 1e-6
        numeric[i, m] = (loss(moved)[0] - value) / 1e-6
    np.testing.assert_allclose(grad, numeric, atol=1e-5)
    # two methods erring in opposite directions: their mean beats either alone
    pair = np.stack([truth + 1, truth - 1], axis=1)
    both = CombinedLoss(truth, pair, np.ones((6, 1)))
    assert both(np.full((6, 2), 0.5))[0] < 0.01 < both(np.tile([1.0, 0.0], (6, 1)))[0]
