"""The windowed forecaster's written-out backward (`WindowForecaster.batched_vjp`,
`models/window_vjp.py`) against autograd in float64: its gradients for every window_norm
(seasonal multiplicative and additive, the clamp active on some outputs, period 1 and 4),
with shared and per-task parameters; MAML's meta-gradient on the explicit path against the
autograd path; the from-scratch baseline's training likewise; and the losses' written-out
gradients (sMAPE, MAPE) that the competition recipes train with."""

import math

import pytest
import torch

import metadist.learners.inner_loop as inner_loop
from metadist.batch import MetaBatch, TaskSet
from metadist.eval import scratch
from metadist.learners import build_learner
from metadist.learners.batching import has_batched_vjp
from metadist.learners.explicit_grad import PREDICTION_GRADS
from metadist.learners.losses import task_losses
from metadist.models import build_model
from metadist.models.seasonal import SeasonalNorm, SeasonalState
from metadist.models.window_vjp import SeasonalMap
from metadist.train.compile_check import cannot_compile_reason

pytestmark = pytest.mark.usefixtures("one_thread")

LOOKBACK, HORIZON = 16, 8
# (id, input features, options): every window map, one and two target channels
FORECASTERS = [
    ("none", 1, {}),
    ("last", 1, {"window_norm": "last"}),
    ("mean-2-features", 2, {"window_norm": "mean", "target_channels": [1]}),
    ("seasonal-m1", 1, {"window_norm": "seasonal", "seasonal_period": 1, "clamp": 0.0}),
    ("seasonal-m4-mult", 1, {"window_norm": "seasonal", "seasonal_period": 4, "clamp": 0.05}),
    ("seasonal-m4-add", 1,
     {"window_norm": "seasonal", "seasonal_period": 4, "seasonality": "additive", "clamp": 0.0}),
    ("seasonal-m4-no-clamp", 2,
     {"window_norm": "seasonal", "seasonal_period": 4, "target_channels": [1]}),
]  # fmt: skip
IDS = [case[0] for case in FORECASTERS]


def _forecaster(num_features, options, seed=0, **extra):
    torch.manual_seed(seed)
    model = build_model("forecaster", (LOOKBACK, num_features), (HORIZON, 1),
                        hidden_sizes=(7, 5), **options, **extra)  # fmt: skip
    return model.double()


def _windows(num_tasks, num_windows, num_features, seed=0, length=LOOKBACK):
    """Seasonal windows of period 4 around a level: positive ones (multiplicative indices)
    for even tasks, ones crossing zero (additive) for odd tasks, and the first task's first
    window front-padded (a repeated first value)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length, dtype=torch.float64)
    shape = (num_tasks, num_windows, length, num_features)
    level = 5 + 3 * torch.rand(num_tasks, num_windows, 1, num_features, generator=g,
                               dtype=torch.float64)  # fmt: skip
    season = 1 + 0.3 * torch.sin(2 * math.pi * t / 4)[:, None]
    x = level * season + 0.2 * torch.randn(*shape, generator=g, dtype=torch.float64)
    x[1::2] -= 6.0
    x[0, 0, :5] = x[0, 0, 5]
    return x


@pytest.mark.parametrize(("name", "num_features", "options"), FORECASTERS, ids=IDS)
@pytest.mark.parametrize("shared", ["per-task", "shared", "mixed"])
def test_batched_vjp_equals_autograd(name, num_features, options, shared):
    model = _forecaster(num_features, options)
    assert has_batched_vjp(model)
    num_tasks = 4
    own = dict(model.named_parameters())

    def per_task(name):
        return shared == "per-task" or (shared == "mixed" and not name.startswith("body.2"))

    params = {
        n: p.detach().expand(num_tasks, *p.shape).clone().requires_grad_() if per_task(n) else p
        for n, p in own.items()
    }
    full = {n: p if p.dim() > own[n].dim() else p.expand(num_tasks, *p.shape)
            for n, p in params.items()}  # fmt: skip
    x = _windows(num_tasks, 6, num_features)
    forecast, vjp = model.batched_vjp(params, x)
    expected = model.batched_forward(full, x)
    torch.testing.assert_close(forecast, expected, rtol=1e-12, atol=1e-12)
    for b in range(num_tasks):  # the forward of each task, as `forward` computes it
        with torch.no_grad():
            alone = torch.func.functional_call(model, {n: v[b] for n, v in full.items()}, x[b])
        torch.testing.assert_close(forecast[b], alone, rtol=1e-12, atol=1e-12)
    grad_forecast = torch.randn_like(forecast)
    names = list(own)
    grads = vjp(grad_forecast, names)
    # per task: w.r.t. the [B, ...] expansion where a parameter is shared
    reference = torch.autograd.grad((expected * grad_forecast).sum(), [full[n] for n in names])
    for n, ref in zip(names, reference, strict=True):
        assert grads[n].shape == (num_tasks, *own[n].shape)
        torch.testing.assert_close(grads[n], ref, rtol=1e-12, atol=1e-12, msg=n)
    assert all(g.abs().sum() > 0 for g in grads.values())


@pytest.mark.parametrize("clamp", [0.0, 0.05])
def test_the_clamp_is_active_on_some_outputs_only(clamp):
    """What the gradient tests above rely on: with these windows and weights, the clamp
    holds some forecasts (whose gradient is 0) and not others."""
    options = {"window_norm": "seasonal", "seasonal_period": 4, "clamp": clamp}
    clamped = _forecaster(1, options)
    free = _forecaster(1, {**options, "clamp": None})
    free.load_state_dict(clamped.state_dict())
    x = _windows(4, 6, 1)
    with torch.no_grad():
        held = clamped(x) != free(x)
    assert 0 < held.sum() < held.numel()


def test_the_clamp_slope_is_autograds_at_ties_and_nan():
    """Forecasts beyond, at and within the bounds (and NaN): the slope equals autograd's
    derivative of `SeasonalNorm.restore` (1/2 at a tie, as `minimum` / `maximum`)."""
    norm = SeasonalNorm(LOOKBACK, 6, 1, (0,), 1, "multiplicative", 0.0)
    state = SeasonalState(
        level=torch.tensor([[0.5]], dtype=torch.float64),
        scale=torch.tensor([[2.0]], dtype=torch.float64),
        multiplier=torch.full((1, 6, 1), 1.5, dtype=torch.float64),
        offset=torch.full((1, 6, 1), -0.75, dtype=torch.float64),
        low=torch.tensor([[-1.5]], dtype=torch.float64),
        high=torch.tensor([[3.0]], dtype=torch.float64),
    )
    # forecasts (0.5 + 2 o) * 1.5 - 0.75: -3, -1.5 (= low), 0, 3 (= high), 4.5, NaN
    output = torch.tensor([[-1.0], [-0.5], [0.0], [1.0], [1.5], [math.nan]], dtype=torch.float64)
    output = output.unsqueeze(0).requires_grad_()
    window = SeasonalMap(norm, state)
    forecast, slope = window.restore_with_slope(output)
    torch.testing.assert_close(forecast, norm.restore(output, state), equal_nan=True)
    (autograd,) = torch.autograd.grad(forecast, output, torch.ones_like(forecast))
    expected = torch.tensor([0.0, 1.5, 3.0, 1.5, 0.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(slope.flatten(), expected)
    torch.testing.assert_close(autograd.flatten(), expected)


def _forecast_batch(num_features, num_tasks=4, num_support=4, num_query=2):
    x = _windows(num_tasks, num_support + num_query, num_features, length=LOOKBACK + HORIZON)
    inputs, targets = x[:, :, :LOOKBACK], x[:, :, LOOKBACK:, -1:]
    support = TaskSet(inputs[:, :num_support], targets[:, :num_support])
    query = TaskSet(inputs[:, num_support:], targets[:, num_support:])
    return MetaBatch(support, query, torch.full((num_tasks,), -1),
                     torch.zeros(num_tasks, dtype=torch.int64), torch.full((num_tasks,), -1))  # fmt: skip


def _never(model):
    return False


def _meta_gradient(model, learner_name, options, explicit, batch, monkeypatch):
    """The meta-loss, meta-gradients and adapted parameters (with and without grad);
    `explicit=False` hides `batched_vjp` from the inner loop (the autograd path)."""
    learner = build_learner(learner_name, model, inner_lr=0.05, **options)
    monkeypatch.setattr(inner_loop, "has_batched_vjp", has_batched_vjp if explicit else _never)
    with torch.no_grad():  # the path is decided now, under the patch
        learner.adapt(batch.support, steps=0)
    assert learner._explicit_grads() == explicit
    out = learner(batch)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in learner.named_parameters()}
    with torch.no_grad():
        fast = learner.adapt(batch.support)
    return out.loss.detach(), grads, fast


LEARNERS = [
    ("maml", {}),
    ("maml", {"inner_steps": 3}),
    ("maml", {"first_order": True, "inner_steps": 2}),
    ("maml", {"learn_inner_lr": True}),
    ("metasgd", {"inner_steps": 2}),
    ("anil", {"inner_steps": 2}),
]


@pytest.mark.parametrize(("name", "num_features", "options"), FORECASTERS, ids=IDS)
@pytest.mark.parametrize(("learner", "learner_options"), LEARNERS)
@pytest.mark.parametrize("loss", ["mse", "smape"])
def test_maml_meta_gradient_explicit_equals_autograd(
    name, num_features, options, learner, learner_options, loss, monkeypatch
):
    batch = _forecast_batch(num_features)
    results = [
        _meta_gradient(
            _forecaster(num_features, options),
            learner,
            {**learner_options, "loss": loss},
            explicit,
            batch,
            monkeypatch,
        )  # fmt: skip
        for explicit in (True, False)
    ]
    (loss_a, grads_a, fast_a), (loss_b, grads_b, fast_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-12, atol=1e-12)
    for a, b in ((grads_a, grads_b), (fast_a, fast_b)):
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=1e-10, atol=1e-12, msg=key)
    assert all(g.abs().sum() > 0 for g in grads_a.values())


def test_the_inner_loop_takes_no_autograd_grad_for_the_forecaster(monkeypatch):
    model = _forecaster(1, FORECASTERS[4][2])
    learner = build_learner("maml", model, loss="smape", inner_steps=2)
    batch = _forecast_batch(1)
    learner(batch).loss.backward()  # the first call checks parameter usage with autograd
    calls = []
    real = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append(1) or real(*a, **k))
    learner(batch).loss.backward()
    with torch.no_grad():
        learner.adapt(batch.support)
    assert calls == []


def test_active_dropout_declines_the_written_out_backward():
    model = _forecaster(1, FORECASTERS[4][2], dropout=0.5)
    params = {n: p.expand(2, *p.shape) for n, p in model.named_parameters()}
    x = _windows(2, 3, 1)
    assert model.batched_vjp(params, x) is None  # train mode: the caller takes autograd
    model.eval()
    assert model.batched_vjp(params, x) is not None


@pytest.mark.parametrize("options", [FORECASTERS[1][2], FORECASTERS[4][2]], ids=IDS[1:5:3])
def test_from_scratch_written_out_equals_autograd(options, monkeypatch):
    """The from-scratch baseline's training (Adam on each task's support set) on the
    forecaster's written-out backward equals the same training through autograd."""
    batch = _forecast_batch(1)
    model = _forecaster(1, options)
    assert scratch._explicit_gradients(model, "mse", batch.support.x, batch.support.y)
    fitted = [scratch.fit_from_scratch(model, batch.support.x, batch.support.y, steps=5,
                                       lr=0.01, loss="mse")]  # fmt: skip
    monkeypatch.setattr(scratch, "_explicit_gradients", lambda *args: None)
    fitted.append(scratch.fit_from_scratch(model, batch.support.x, batch.support.y, steps=5,
                                           lr=0.01, loss="mse"))  # fmt: skip
    for name, value in fitted[0].items():
        torch.testing.assert_close(value, fitted[1][name], rtol=1e-10, atol=1e-12, msg=name)
        assert not torch.equal(value[0], dict(model.named_parameters())[name])


def test_second_order_maml_of_the_forecaster_may_compile():
    model = _forecaster(1, FORECASTERS[4][2])
    for loss in ("mse", "mae", "smape", "mape"):
        assert cannot_compile_reason(build_learner("maml", model, loss=loss)) is None
    # per task (no batched inner loop): a double backward through autograd's backward
    per_task = build_learner("maml", model, vectorize=False)
    assert "double backward" in str(cannot_compile_reason(per_task))


@pytest.mark.parametrize("loss", ["smape", "mape"])
def test_percentage_losses_gradients_equal_autograd(loss):
    """First and second derivatives, zeros in the targets and predictions included."""
    g = torch.Generator().manual_seed(0)
    prediction = torch.randn(3, 5, 2, generator=g, dtype=torch.float64)
    target = torch.randn(3, 5, 2, generator=g, dtype=torch.float64)
    target[0, 0] = 0.0
    prediction[0, 0, 0] = prediction[1, 0, 0] = 0.0  # both zero; the prediction alone
    prediction.requires_grad_()
    (reference,) = torch.autograd.grad(
        task_losses(loss, prediction, target).sum(), prediction, create_graph=True
    )
    written = PREDICTION_GRADS[loss](prediction, target)
    torch.testing.assert_close(written, reference, rtol=1e-14, atol=1e-15)
    direction = torch.randn(3, 5, 2, generator=g, dtype=torch.float64)
    second = [torch.autograd.grad((grad * direction).sum(), prediction)[0]
              for grad in (written, reference)]  # fmt: skip
    torch.testing.assert_close(second[0], second[1], rtol=1e-12, atol=1e-12)
    assert second[0].abs().sum() > 0 or loss == "mape"  # MAPE is linear between its kinks


@pytest.mark.slow
def test_torch_compile_of_second_order_maml_on_the_seasonal_forecaster_matches_eager():
    """No double backward is left in the meta-step of the forecaster either, so Inductor
    compiles it (about a minute on a loaded CPU)."""
    batch = _forecast_batch(1)
    grads = []
    for compiled in (False, True):
        model = _forecaster(1, FORECASTERS[4][2])
        learner = build_learner("maml", model, inner_steps=2, inner_lr=0.05, loss="smape")
        call = torch.compile(learner) if compiled else learner
        call(batch).loss.backward()
        grads.append({n: p.grad for n, p in learner.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=0, atol=1e-10, msg=name)
