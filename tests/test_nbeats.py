"""The N-BEATS model: bases, residual stacking, batched path and exact meta-gradients."""

import math

import pytest
import torch
from test_learners import finite_difference, make_batch, meta_gradient

from metadist.learners import build_learner
from metadist.models import build_model

INTERPRETABLE = {"stacks": ["trend", "seasonality", "generic"], "blocks_per_stack": 1}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_blocks_are_doubly_residual():
    """Block i reads the window minus the backcasts of blocks < i; the forecast is the sum
    of every block's forecast (recomputed here by hand from the layers)."""
    torch.manual_seed(0)
    model = build_model("nbeats", (6, 1), (3, 1), blocks_per_stack=3, layers=2, width=5)
    model = model.double()
    x = torch.randn(4, 6, 1, dtype=torch.float64)
    residual, total = x.reshape(4, 6), torch.zeros(4, 3, dtype=torch.float64)
    for index, block in enumerate(model.blocks):
        hidden = residual
        for layer in block["fc"]:
            hidden = torch.relu(layer(hidden))
        if index < 2:
            total = total + block["forecast"](hidden)
            residual = residual - block["backcast"](hidden)
        else:
            assert "backcast" not in block and "forecast" not in block
            total = total + model.head(hidden)
    torch.testing.assert_close(model(x), total.reshape(4, 3, 1))


def test_trend_and_seasonality_bases_continue_the_window_into_the_horizon():
    """A trend block's coefficients give one polynomial over backcast and forecast steps;
    the seasonality basis holds cosines and sines of periods H/k."""
    model = build_model("nbeats", (4, 1), (2, 1), stacks=["trend", "seasonality"], degree=2)
    past, future = model.trend_backcast.double(), model.trend_forecast.double()
    t_past = (torch.arange(4.0) - 4) / 4
    t_future = torch.arange(2.0) / 4
    torch.testing.assert_close(past, torch.stack([t_past**0, t_past, t_past**2]).double())
    torch.testing.assert_close(future, torch.stack([t_future**0, t_future, t_future**2]).double())
    season = model.seasonality_forecast.double()
    assert season.shape == (3, 2)  # 1, cos, sin for H // 2 = 1 harmonic
    torch.testing.assert_close(season[1], torch.cos(math.pi * torch.arange(2.0)).double())
    # Expansion: coefficients [P·C] on the basis, channel-last like the window.
    theta = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    expected = (theta[0, 0] + theta[0, 1] * t_future + theta[0, 2] * t_future**2).double()
    torch.testing.assert_close(model._expand("trend", "forecast", theta)[0], expected)


def test_interpretable_stacks_need_windows():
    with pytest.raises(ValueError, match=r"trend and seasonality stacks need input_shape \(L, F\)"):
        build_model("nbeats", (6, 1), (4,), stacks=["trend"])
    with pytest.raises(ValueError, match="stacks must be a non-empty list of generic"):
        build_model("nbeats", (6, 1), (3, 1), stacks=["fourier"])
    with pytest.raises(ValueError, match="model.options.blocks_per_stak"):
        build_model("nbeats", (6, 1), (3, 1), blocks_per_stak=2)


@pytest.mark.parametrize("options", [{}, INTERPRETABLE], ids=["generic", "interpretable"])
@pytest.mark.parametrize("window_norm", ["none", "last"])
def test_batched_forward_equals_functional_call_per_task(options, window_norm):
    from metadist.learners.base import has_batched_forward

    torch.manual_seed(0)
    model = build_model(
        "nbeats",
        (6, 2),
        (3, 2),
        width=7,
        window_norm=window_norm,
        target_channels=[0, 1] if window_norm != "none" else None,
        **options,
    ).double()
    assert has_batched_forward(model)
    params = {
        n: p.detach() + 0.1 * torch.randn(4, *p.shape, dtype=p.dtype)
        for n, p in model.named_parameters()
    }
    x = torch.randn(4, 5, 6, 2, dtype=torch.float64)
    batched = model.batched_forward(params, x)
    for b in range(4):
        expected = torch.func.functional_call(model, {n: p[b] for n, p in params.items()}, x[b])
        torch.testing.assert_close(batched[b], expected)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("maml", {"inner_steps": 2, "inner_lr": 0.1}),
        ("maml", {"inner_steps": 1, "inner_lr": 0.1, "learn_inner_lr": True}),
        ("metasgd", {"inner_steps": 1, "inner_lr": 0.1}),
        ("anil", {"inner_steps": 2, "inner_lr": 0.1}),
    ],
)
def test_second_order_meta_gradient_matches_finite_differences(name, options):
    torch.manual_seed(0)
    model = build_model("nbeats", (6, 1), (2, 1), width=3, layers=1, **INTERPRETABLE).double()
    learner = build_learner(name, model, **options)
    batch = make_batch(dtype=torch.float64, x_shape=(6, 1), y_shape=(2, 1))
    analytic = meta_gradient(learner, batch)
    numeric = finite_difference(learner, batch)
    for key in analytic:
        torch.testing.assert_close(analytic[key], numeric[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("learner_name", "first_order"),
    [("maml", False), ("maml", True), ("metasgd", False), ("anil", False), ("reptile", True)],
    ids=["maml", "fomaml", "metasgd", "anil", "reptile"],
)
def test_interpretable_stacks_batch_like_the_loop(learner_name, first_order):
    """The trend and seasonality bases on the batched path (the model's batched_forward)
    give the per-task loop's losses, meta-gradients and adapted forecasts."""
    torch.manual_seed(0)
    model = build_model("nbeats", (6, 1), (2, 1), width=8, window_norm="last", **INTERPRETABLE)
    batch = make_batch(num_tasks=3, x_shape=(6, 1), y_shape=(2, 1))
    options = {} if learner_name == "reptile" else {"inner_steps": 2, "first_order": first_order}
    results = []
    for vectorize in (True, False):
        learner = build_learner(learner_name, model, vectorize=vectorize, **options)
        out = learner(batch)
        learner.zero_grad()
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in learner.named_parameters()}
        with torch.no_grad():
            prediction = learner.predict(learner.adapt(batch.support, steps=2), batch.query.x)
        results.append((out.loss, grads, prediction))
        assert not learner._vmap_failed
    (loss_v, grads_v, pred_v), (loss_l, grads_l, pred_l) = results
    torch.testing.assert_close(loss_v, loss_l, rtol=1e-6, atol=1e-6)
    for key in grads_l:
        torch.testing.assert_close(grads_v[key], grads_l[key], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pred_v, pred_l, rtol=1e-6, atol=1e-6)
