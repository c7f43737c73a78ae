"""Evaluation at the speed of training, with the same numbers: the batched from-scratch
baseline equals each episode trained alone, the statistical forecasts are identical on any
number of worker processes, a second evaluation reuses the baselines the first kept (and
changed settings recompute them), and every phase shows its progress."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_runs import tiny_store, train_tiny

from metadist import progress
from metadist.eval import baselines, evaluate_run, scratch
from metadist.eval.cache import PREDICTIONS_FILE, PRETRAINED_FILE
from metadist.eval.scratch import fit_from_scratch, predict_stacked
from metadist.eval.statistical import StatisticalForecasts, forecast_jobs
from metadist.models import build_model

STEPS = 12


@pytest.mark.parametrize(
    ("name", "options", "loss", "path"),
    [
        # its own batched_forward and written-out backward (batched_vjp)
        ("mlp", {"hidden_sizes": [16]}, "cross_entropy", "explicit"),
        ("mlp", {"hidden_sizes": [16, 8]}, "mse", "explicit"),
        # the forecaster's: the MLP's through the window map (models/window_vjp.py)
        ("forecaster", {"hidden_sizes": [16]}, "mse", "explicit"),
        (
            "forecaster",
            {
                "hidden_sizes": [16],
                "window_norm": "seasonal",
                "seasonal_period": 2,
                "target_channels": [1],
                "clamp": 0.5,
            },
            "mse",
            "explicit",
        ),
        # the same through autograd, its weights kept in their gradients' layout
        ("mlp", {"hidden_sizes": [16]}, "cross_entropy", "autograd"),
        ("tcn", {"channels": 4, "num_levels": 2, "pool": "mean"}, "cross_entropy", "vmap"),
    ],
)
def test_from_scratch_batched_equals_each_episode_trained_alone(
    name, options, loss, path, monkeypatch
):
    if path == "autograd" and name == "mlp":
        monkeypatch.setattr(scratch, "_explicit_gradients", lambda *args: None)
    torch.manual_seed(0)
    output_shape = (3,) if loss == "cross_entropy" else (2, 1)
    model = build_model(name, (8, 2), output_shape, **options)
    num_tasks, num_support = 5, 6
    x = torch.randn(num_tasks, num_support, 8, 2)
    if loss == "cross_entropy":
        y = torch.randint(0, 3, (num_tasks, num_support))
    else:
        y = torch.randn(num_tasks, num_support, *output_shape)
    query = torch.randn(num_tasks, 4, 8, 2)
    explicit = scratch._explicit_gradients(model, loss, x, y) is not None
    assert explicit == (path == "explicit")
    initial = copy.deepcopy(model.state_dict())
    params = fit_from_scratch(model, x, y, steps=STEPS, lr=0.01, loss=loss)
    batched = predict_stacked(model, params, query)
    for b in range(num_tasks):
        # an independent computation: the plain module and torch.optim.Adam, one episode
        alone = copy.deepcopy(model).eval()
        optimizer = torch.optim.Adam(alone.parameters(), lr=0.01)
        for _ in range(STEPS):
            optimizer.zero_grad()
            output = alone(x[b])
            error = (
                F.cross_entropy(output, y[b])
                if loss == "cross_entropy"
                else F.mse_loss(output, y[b])
            )
            error.backward()
            optimizer.step()
        with torch.no_grad():
            torch.testing.assert_close(batched[b], alone(query[b]), rtol=1e-4, atol=1e-5)
    # the template itself is not trained
    assert all(torch.equal(v, initial[k]) for k, v in model.state_dict().items())


def test_a_transposed_gradient_is_adopted_in_its_dense_layout():
    dense = torch.randn(3, 5, 4)
    order = scratch._dense_order(dense.transpose(1, 2))  # a [3, 4, 5] view of [3, 5, 4]
    assert order == [0, 2, 1] and dense.transpose(1, 2).permute(order).is_contiguous()
    assert scratch._dense_order(dense) is None  # dense already
    assert scratch._dense_order(dense[:, ::2]) is None  # strided: no permutation is dense


@pytest.mark.parametrize(
    "scores",
    [baselines.nearest_centroid_scores, baselines.one_nn_scores],
    ids=["nearest_centroid", "one_nn"],
)
def test_raw_classifiers_of_a_batch_equal_each_episode_alone(scores):
    generator = torch.Generator().manual_seed(0)
    support_x = torch.randn(7, 10, 12, 3, generator=generator)
    support_y = torch.arange(5).repeat(2).expand(7, 10)
    query_x = torch.randn(7, 15, 12, 3, generator=generator)
    batched = scores(support_x, support_y, query_x, 5)
    for b in range(7):
        alone = scores(support_x[b : b + 1], support_y[b : b + 1], query_x[b : b + 1], 5)
        torch.testing.assert_close(batched[b], alone[0], rtol=1e-12, atol=1e-12)


def _series(num: int, seed: int = 0) -> list[tuple[np.ndarray, int, int]]:
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(num):
        n = int(rng.integers(30, 90))
        t = np.arange(n)
        y = 10 + 0.05 * t + 3 * np.sin(2 * np.pi * t / 12) + rng.normal(0, 0.5, n)
        jobs.append((y[:, None], 6, 12 if i % 2 else 1))
    return jobs


def test_statistical_forecasts_are_identical_on_any_number_of_workers():
    jobs = _series(23)
    methods = ["theta"]
    try:
        import statsforecast  # noqa: F401

        methods.append("ets")
    except ImportError:
        pass
    one = forecast_jobs(jobs, ("ets",) if "ets" in methods else ())
    for workers in (1, 2):
        pool = StatisticalForecasts(methods, workers=workers)
        try:
            first, second = pool.start(jobs[:11]), pool.start(jobs[11:])
            got = pool.collect(first) + pool.collect(second)
        finally:
            pool.close()
        assert len(got) == len(jobs) and pool.done == len(jobs)
        for expected, forecast in zip(one, got, strict=True):
            assert expected.keys() == forecast.keys()
            for method in expected:
                np.testing.assert_array_equal(forecast[method], expected[method])
    # each forecast is the baseline function's own
    history, horizon, period = jobs[1]
    np.testing.assert_array_equal(
        one[1]["theta"], baselines.theta_forecast(history, horizon, period)
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("speed")
    return tiny_store(root, num_entities=64, seed=1)


@pytest.fixture(scope="module")
def class_run(store, tmp_path_factory):
    return train_tiny(
        store,
        tmp_path_factory.mktemp("class_run") / "run",
        "experiment=synthetic_protonet",
        "data.fractions=[0.5,0,0.5]",
        "sampler.options.num_ways=2",
        "sampler.options.num_shots=1",
        "sampler.options.num_query=2",
        "sampler.options.lookback=16",
    )


CLASS_EVAL = ["eval.scratch_steps=3", "eval.pretrain_steps=6", "eval.tasks_per_unit=1"]


def _scores(result):
    return {m: s[result["primary_metric"]]["value"] for m, s in result["overall"].items()}


@pytest.mark.integration
def test_a_second_evaluation_reuses_the_pretrained_embedding_and_baselines(class_run, monkeypatch):
    first = evaluate_run(class_run, overrides=CLASS_EVAL, write=False, progress=False)
    assert "reused" not in first["settings"]
    assert (class_run / "eval" / PRETRAINED_FILE).is_file()
    assert (class_run / "eval" / PREDICTIONS_FILE).is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("the pretrained embedding was trained again")

    with monkeypatch.context() as patched:
        patched.setattr(baselines, "pretrain_embedding", no_training)
        second = evaluate_run(class_run, overrides=CLASS_EVAL, write=False, progress=False)
    assert "pretrained embedding" in second["settings"]["reused"]
    assert "from-scratch predictions" in second["settings"]["reused"]
    assert "Baseline++" in second["settings"]["reused"]
    assert _scores(second) == _scores(first)  # the very numbers, not approximately
    assert second["per_task"] == first["per_task"]

    # changed pretraining settings train it again (and keep that one); the from-scratch
    # predictions, whose settings did not change, are still reused
    other = [*CLASS_EVAL, "eval.pretrain_lr=0.01"]
    retrained = evaluate_run(class_run, overrides=other, write=False, progress=False)
    assert "pretrained embedding" not in retrained["settings"]["reused"]
    assert "from-scratch predictions" in retrained["settings"]["reused"]
    assert "Baseline++" not in retrained["settings"]["reused"]  # another backbone
    assert _scores(retrained)["pretrained"] != _scores(first)["pretrained"]
    with monkeypatch.context() as patched:
        patched.setattr(baselines, "pretrain_embedding", no_training)
        again = evaluate_run(class_run, overrides=other, write=False, progress=False)
    assert _scores(again) == _scores(retrained)

    # another from-scratch learning rate is trained again; cache=False reuses nothing
    scratch = evaluate_run(
        class_run, overrides=[*other, "eval.scratch_lr=0.05"], write=False, progress=False
    )
    assert "from-scratch predictions" not in scratch["settings"]["reused"]
    fresh = evaluate_run(class_run, overrides=CLASS_EVAL, write=False, cache=False)
    assert "reused" not in fresh["settings"] and _scores(fresh) == _scores(first)


@pytest.mark.integration
def test_every_phase_shows_progress_and_the_total_time_covers_them(class_run, monkeypatch, capsys):
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    result = evaluate_run(class_run, overrides=CLASS_EVAL, write=False, progress=True, cache=False)
    lines = capsys.readouterr().err.splitlines()
    for phase, unit in (
        ("pretrained embedding", "steps"),
        ("from scratch", "task-steps"),
        ("evaluating", "tasks"),
    ):
        shown = [line for line in lines if line.startswith(f"{phase}: ")]
        assert shown and f" {unit} (" in shown[-1] and "left" in shown[-1], lines
    timings = result["timings"]
    assert result["settings"]["seconds"] == timings["total"]
    assert (
        timings["total"]
        >= timings["setup"] + timings["pretrained embedding"] + timings["scoring"] - 0.02
    )


@pytest.fixture(scope="module")
def forecast_run(store, tmp_path_factory):
    return train_tiny(
        store,
        tmp_path_factory.mktemp("forecast_run") / "run",
        "experiment=synthetic_maml",
        "data.fractions=[0.5,0,0.5]",
        "sampler.options.lookback=16",
        "sampler.options.horizon=4",
        "sampler.options.num_support=3",
        "sampler.options.num_query=1",
    )


@pytest.mark.integration
def test_a_second_forecast_evaluation_reuses_the_statistical_forecasts(forecast_run):
    overrides = ["eval.scratch_steps=3", "eval.batch_size=8"]
    first = evaluate_run(forecast_run, overrides=overrides, write=False, progress=False)
    second = evaluate_run(forecast_run, overrides=overrides, write=False, progress=False)
    assert "statistical forecasts" in second["settings"]["reused"]
    assert "from-scratch predictions" in second["settings"]["reused"]
    assert _scores(second) == _scores(first)
    assert second["forecasts"] == first["forecasts"]
    # computed again, without the cache: the same numbers
    again = evaluate_run(forecast_run, overrides=overrides, write=False, cache=False)
    assert "reused" not in again["settings"] and _scores(again) == _scores(first)


@pytest.mark.integration
def test_the_written_report_time_covers_the_report_too(forecast_run):
    """`settings.seconds` (what `metadist eval` prints) and `metrics.json`'s count the
    report's own writing (the figure, the per-task rows) as a phase."""
    result = evaluate_run(forecast_run, overrides=["eval.scratch_steps=3"], progress=False)
    timings = result["timings"]
    assert timings["report"] > 0 and result["settings"]["seconds"] == timings["total"]
    phases = sum(v for k, v in timings.items() if k != "total")
    assert timings["total"] >= phases - 0.03  # rounded to 0.01 each
    written = json.loads((forecast_run / "eval" / "metrics.json").read_text())
    assert written["timings"] == timings and written["settings"]["seconds"] == timings["total"]
    assert (forecast_run / "eval" / "forecasts.png").is_file()


def test_autoets_forecasts_are_keyed_by_the_statsforecast_version(monkeypatch):
    """AutoETS is statsforecast's: a cached forecast of another version is not reused
    (the key held metadist's, torch's and numpy's versions only)."""
    from metadist.eval import statistical

    job = _series(1)[0]
    keys = {}
    for version in ("1.7.0", "2.0.0"):
        monkeypatch.setattr(statistical, "_ets_version", lambda v=version: v)
        for method in ("ets", "theta"):
            keys[version, method] = StatisticalForecasts([method], workers=1).key(*job)
    assert keys["1.7.0", "ets"] != keys["2.0.0", "ets"]
    assert keys["1.7.0", "theta"] == keys["2.0.0", "theta"]  # no AutoETS: kept as it was
