"""The forecaster's seasonal window normalisation (`window_norm: seasonal`): exact on
purely seasonal and constant windows, finite on zeros, negatives and padding, the same on
the batched, vmapped and looped paths, and its options checked."""

import math

import pytest
import torch
from torch import nn

from metadist.learners import build_learner
from metadist.models import build_model
from metadist.models.seasonal import SeasonalNorm

INDICES = {
    12: [0.5, 0.7, 1.0, 1.3, 1.6, 1.8, 1.7, 1.4, 1.1, 0.8, 0.6, 0.5],
    4: [0.8, 1.3, 1.2, 0.7],
    3: [1.5, 0.5, 1.0],
}


pytestmark = pytest.mark.usefixtures("one_thread")


def seasonal_model(lookback, horizon, features=1, zero_head=True, **options):
    """A float64 seasonal forecaster whose MLP outputs 0 (the level) where `zero_head`."""
    torch.manual_seed(0)
    options = {"window_norm": "seasonal", "hidden_sizes": (8,), **options}
    if features > 1:
        options.setdefault("target_channels", [0])
    model = build_model("forecaster", (lookback, features), (horizon, 1), **options).double()
    if zero_head:
        nn.init.zeros_(model.head.weight)
        nn.init.zeros_(model.head.bias)
    return model


def series(period, length, level=100.0, additive=False, start=0):
    """`[length]` float64: level · s_{t mod m} (or level + 10·(s − 1)) for t = start.."""
    s = torch.tensor(INDICES[period], dtype=torch.float64)
    t = torch.arange(start, start + length)
    return level + 10.0 * (s[t % period] - 1.0) if additive else level * s[t % period]


def naive(period, lookback, horizon, **kwargs):
    """The window and its seasonal naive forecast, `[1, L, 1]` and `[1, H, 1]`."""
    whole = series(period, lookback + horizon, **kwargs)
    return whole[:lookback].reshape(1, -1, 1), whole[lookback:].reshape(1, -1, 1)


@pytest.mark.parametrize(
    ("period", "lookback", "horizon"), [(12, 48, 24), (12, 30, 18), (4, 16, 8), (3, 10, 7)]
)
@pytest.mark.parametrize("level", [100.0, 0.37])
def test_a_purely_seasonal_window_gets_its_seasonal_naive_forecast(
    period, lookback, horizon, level
):
    model = seasonal_model(lookback, horizon, seasonal_period=period)
    for start in range(period):  # every phase at the window's end
        x, expected = naive(period, lookback, horizon, level=level, start=start)
        torch.testing.assert_close(model(x), expected, rtol=1e-12, atol=1e-12 * level)


@pytest.mark.parametrize("level", [100.0, -5.0, 3.0])
def test_additive_seasonality_and_negative_values(level):
    """Additive indices (by choice, or because a window has values <= 0) are exact too."""
    for seasonality in ("additive", "multiplicative"):
        model = seasonal_model(24, 6, seasonal_period=4, seasonality=seasonality)
        x, expected = naive(4, 24, 6, level=level, additive=True, start=1)
        if seasonality == "multiplicative" and level > 0:
            continue  # positive: multiplicative indices, which an additive series breaks
        torch.testing.assert_close(model(x), expected, rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("constant", [42.0, 0.0, -3.5, 1e-6])
@pytest.mark.parametrize("period", [1, 4, 12])
def test_a_constant_window_is_forecast_as_the_constant(constant, period):
    model = seasonal_model(36, 6, seasonal_period=period, clamp=0.5)
    x = torch.full((2, 36, 1), constant, dtype=torch.float64)
    torch.testing.assert_close(model(x), torch.full((2, 6, 1), constant, dtype=torch.float64))


def test_period_one_or_a_short_window_is_the_last_value_normalisation():
    """No seasonality (m = 1, or L < 2m): the forecaster with window_norm "last"."""
    x = torch.randn(5, 20, 1, dtype=torch.float64) * 3 + 10
    reference = seasonal_model(20, 4, zero_head=False, window_norm="last")
    for period in (1, 11, 20):
        model = seasonal_model(20, 4, zero_head=False, seasonal_period=period)
        model.load_state_dict(reference.state_dict())
        torch.testing.assert_close(model(x), reference(x))


@pytest.mark.parametrize("pad", [0.0, "first"])
def test_front_padding_is_not_taken_for_a_season(pad):
    """A window padded at the front (zeros, or its first value repeated as the sampler
    pads) is decomposed over its real part: with two whole seasons there, the seasonal
    naive forecast; with fewer, no seasonality (a flat forecast at the last season's mean)."""
    model = seasonal_model(48, 12, seasonal_period=12)
    for real, seasonal in ((24, True), (30, True), (23, False)):
        whole = series(12, 60, start=48 - real)  # the real part ends at the window's end
        x = whole[:48].clone()
        x[: 48 - real] = 0.0 if pad == 0.0 else x[48 - real]
        forecast = model(x.reshape(1, 48, 1))[0, :, 0]
        flat = x[-12:].mean().expand(12)
        torch.testing.assert_close(
            forecast, whole[48:] if seasonal else flat, rtol=1e-12, atol=1e-10
        )


def _edge_windows(lookback):
    t = torch.arange(lookback, dtype=torch.float64)
    seasonal = 50 + 40 * torch.sin(2 * math.pi * t / 12)
    padded = seasonal.clone()
    padded[: lookback // 2] = 0.0
    repeated = seasonal.clone()
    repeated[: lookback - 5] = seasonal[lookback - 5]
    spiky = torch.zeros(lookback, dtype=torch.float64)
    spiky[-3] = 1e6
    rows = [
        torch.zeros(lookback, dtype=torch.float64),  # all zeros
        padded,  # zero padding then a positive series
        repeated,  # padding by repetition, 5 real values
        seasonal - 50,  # mixed signs
        -seasonal,  # all negative
        seasonal * 1e-30,  # tiny positive
        seasonal * 1e30,  # huge
        spiky,  # intermittent
        torch.where(t % 12 == 0, 0.0, seasonal),  # positive with zeros in season
    ]
    return torch.stack(rows).unsqueeze(-1)


@pytest.mark.parametrize("seasonality", ["multiplicative", "additive"])
@pytest.mark.parametrize("clamp", [None, 0.5])
def test_edge_cases_are_finite_forward_and_backward(seasonality, clamp):
    model = seasonal_model(
        36, 12, zero_head=False, seasonal_period=12, seasonality=seasonality, clamp=clamp
    )
    x = _edge_windows(36).requires_grad_(True)
    out = model(x)
    assert torch.isfinite(out).all()
    (out / (1 + out.detach().abs())).sum().backward()
    assert torch.isfinite(x.grad).all()
    for name, parameter in model.named_parameters():
        assert torch.isfinite(parameter.grad).all(), name
    assert torch.isfinite(model.float()(x.detach().float())).all()


def test_gradients_reach_every_parameter_of_the_network():
    model = seasonal_model(48, 12, zero_head=False, seasonal_period=12)
    x = torch.stack([series(12, 48, level=lv, start=s) for lv, s in ((80, 0), (5, 7))])
    x = x.unsqueeze(-1) * (1 + 0.05 * torch.randn(2, 48, 1, dtype=torch.float64))
    model(x).pow(2).mean().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_clamp_keeps_forecasts_within_the_range_of_the_window():
    model = seasonal_model(24, 6, zero_head=False, seasonal_period=4, clamp=0.25)
    nn.init.constant_(model.head.bias, 1e9)  # a wildly high forecast...
    x = series(4, 24).reshape(1, 24, 1)
    top, bottom = x.max().item(), x.min().item()
    expected = top + 0.25 * (top - bottom)  # ...stops at max + c · range
    torch.testing.assert_close(model(x), torch.full((1, 6, 1), expected, dtype=torch.float64))
    nn.init.constant_(model.head.bias, -1e9)
    low = bottom - 0.25 * (top - bottom)
    torch.testing.assert_close(model(x), torch.full((1, 6, 1), low, dtype=torch.float64))


def test_equivariance_of_the_two_seasonalities():
    """Multiplicative: a · x (a > 0) → a · f(x); additive: a · x + b → a · f(x) + b."""
    x = _edge_windows(36)[[1, 3, 6]].clone() + torch.rand(3, 36, 1, dtype=torch.float64)
    x = x.abs() + 1.0
    for seasonality, shift in (("multiplicative", 0.0), ("additive", -300.0)):
        model = seasonal_model(36, 6, zero_head=False, seasonal_period=12, seasonality=seasonality)
        torch.testing.assert_close(model(2.5 * x + shift), 2.5 * model(x) + shift)


def test_covariates_pass_unchanged_and_the_target_channel_is_chosen():
    norm = SeasonalNorm(24, 6, num_features=3, channels=(1,), period=4)
    x = torch.randn(2, 24, 3, dtype=torch.float64)
    x[..., 1] = series(4, 24) + 0.1 * torch.randn(2, 24, dtype=torch.float64)
    normalised, state = norm.normalise(x)
    torch.testing.assert_close(normalised[..., [0, 2]], x[..., [0, 2]])
    alone, alone_state = SeasonalNorm(24, 6, 1, (0,), period=4).normalise(x[..., 1:2])
    torch.testing.assert_close(normalised[..., 1:2], alone)
    for got, want in zip(state, alone_state, strict=True):
        assert (got is None and want is None) or torch.equal(got, want)


def test_windows_are_independent():
    model = seasonal_model(36, 6, zero_head=False, seasonal_period=12, clamp=1.0)
    x = _edge_windows(36)
    together = model(x)
    alone = torch.cat([model(x[i : i + 1]) for i in range(len(x))])
    torch.testing.assert_close(together, alone)


def _params(model, num_tasks):
    torch.manual_seed(1)
    return {
        n: p.detach() + 0.1 * torch.randn(num_tasks, *p.shape, dtype=p.dtype)
        for n, p in model.named_parameters()
    }


def test_batched_forward_and_vmap_equal_functional_call_per_task():
    from metadist.learners.base import has_batched_forward

    model = seasonal_model(36, 6, zero_head=False, seasonal_period=12, clamp=1.0)
    assert has_batched_forward(model)
    x = _edge_windows(36)[None].expand(4, -1, -1, -1) * torch.rand(4, 1, 1, 1).double()
    params = _params(model, 4)
    looped = torch.stack(
        [
            torch.func.functional_call(model, {n: p[b] for n, p in params.items()}, x[b])
            for b in range(4)
        ]
    )
    torch.testing.assert_close(model.batched_forward(params, x), looped)
    vmapped = torch.func.vmap(lambda p, xb: torch.func.functional_call(model, p, xb))(params, x)
    torch.testing.assert_close(vmapped, looped)


@pytest.mark.parametrize("learner_name", ["maml", "metasgd", "anil"])
def test_learners_batch_like_the_loop(learner_name):
    """Meta-loss, meta-gradients and adapted predictions on the batched path (the MLP's
    native one) equal the per-task loop's, with padded, zero and seasonal windows."""
    from metadist.batch import MetaBatch, TaskSet

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    windows = _edge_windows(36)[:8] + 1.0  # [8, 36, 1]

    def side(k):
        rows = torch.randint(0, 8, (3, k), generator=g)
        scale = torch.rand(3, k, 1, 1, generator=g, dtype=torch.float64) + 0.5
        return TaskSet(windows[rows] * scale, torch.rand(3, k, 6, 1, generator=g).double())

    batch = MetaBatch(
        support=side(4),
        query=side(5),
        entity_index=torch.full((3,), -1),
        stratum=torch.zeros(3, dtype=torch.int64),
        split_time=torch.full((3,), -1),
    )
    model = seasonal_model(36, 6, zero_head=False, seasonal_period=12, clamp=1.0)
    results = []
    for vectorize in (True, False):
        learner = build_learner(learner_name, model, vectorize=vectorize, inner_steps=2)
        learner.zero_grad()
        out = learner(batch)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in learner.named_parameters()}
        with torch.no_grad():
            prediction = learner.predict(learner.adapt(batch.support, steps=2), batch.query.x)
        assert not learner._vmap_failed
        results.append((out.loss, grads, prediction))
    (loss_v, grads_v, pred_v), (loss_l, grads_l, pred_l) = results
    torch.testing.assert_close(loss_v, loss_l)
    for key in grads_l:
        torch.testing.assert_close(grads_v[key], grads_l[key])
    torch.testing.assert_close(pred_v, pred_l)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"window_norm": "seasonal", "seasonal_period": 0}, "seasonal_period must be"),
        ({"window_norm": "seasonal", "seasonality": "both"}, "seasonality must be one of"),
        ({"window_norm": "seasonal", "clamp": -1.0}, "clamp must be >= 0"),
        ({"window_norm": "last", "seasonal_period": 12}, "seasonal_period applies with"),
        ({"window_norm": "mean", "clamp": 1.0}, "clamp applies with window_norm: seasonal"),
        ({"seasonality": "additive"}, "seasonality applies with"),
        ({"window_norm": "seasonl"}, "window_norm must be one of none, last, mean, seasonal"),
    ],
)
def test_bad_seasonal_options_name_the_field(options, match):
    with pytest.raises(ValueError, match=match):
        build_model("forecaster", (24, 1), (6, 1), **options)


def test_seasonal_norm_needs_horizon_outputs_and_target_channels():
    with pytest.raises(ValueError, match=r"output_shape must be \(H, T\)"):
        build_model("forecaster", (24, 1), (5,), window_norm="seasonal")
    with pytest.raises(ValueError, match="needs target_channels"):
        build_model("forecaster", (24, 2), (6, 1), window_norm="seasonal")
