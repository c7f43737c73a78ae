"""Models: shapes over any leading dims, option and shape validation, the registry."""

import pytest
import torch
from torch import nn

from metadist.models import MODELS, build_model, get_model, register_model, registered_models

WINDOW = (6, 2)  # (L, F)
HORIZON = (3, 2)  # (H, T)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_builtin_models_are_registered():
    assert {"mlp", "forecaster", "tcn", "transformer", "gru"} <= set(registered_models())


@pytest.mark.parametrize("name", registered_models())
@pytest.mark.parametrize("leading", [(), (5,), (3, 4)])
def test_maps_any_leading_dims(name, leading):
    torch.manual_seed(0)
    model = build_model(name, WINDOW, HORIZON)
    x = torch.randn(*leading, *WINDOW)
    out = model(x)
    assert out.shape == (*leading, *HORIZON)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", registered_models())
def test_examples_are_independent(name):
    """Example i's prediction depends on example i only (no mixing across windows)."""
    torch.manual_seed(0)
    model = build_model(name, WINDOW, HORIZON).eval()
    x = torch.randn(4, *WINDOW)
    together = model(x)
    alone = torch.stack([model(x[i : i + 1])[0] for i in range(4)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", registered_models())
def test_classification_and_embedding_outputs(name):
    model = build_model(name, WINDOW, (5,))
    assert model(torch.randn(2, 3, *WINDOW)).shape == (2, 3, 5)


@pytest.mark.parametrize("name", registered_models())
def test_every_model_has_a_head(name):
    model = build_model(name, WINDOW, HORIZON)
    assert isinstance(model.head, nn.Linear)
    assert model.head.out_features == HORIZON[0] * HORIZON[1]


@pytest.mark.parametrize("name", registered_models())
def test_wrong_trailing_dims_name_the_model(name):
    model = build_model(name, WINDOW, HORIZON)
    with pytest.raises(ValueError, match=rf"model '{name}' expects inputs \[\.\.\., 6, 2\]"):
        model(torch.randn(4, 7, 2))


BUILTIN_MODELS = ["mlp", "forecaster", "nbeats", "tcn", "transformer", "gru"]


@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_builtin_models_keep_their_options_typed(name):
    """The registry reads a built-in model's options into its nested `Options` and the
    model keeps that object; a constructor call with keywords gives an equal one."""
    cls = get_model(name)
    assert MODELS.options_schema(name) is cls.Options
    options = MODELS.read_options(name, {})
    model = build_model(name, WINDOW, HORIZON, options=options)
    assert model.options is options
    assert cls(WINDOW, HORIZON).options == cls.Options()


def test_mlp_serves_the_sinusoid():
    model = build_model("mlp", (1,), (1,))
    assert [m.out_features for m in model.modules() if isinstance(m, nn.Linear)] == [40, 40, 1]
    assert model(torch.randn(25, 10, 1)).shape == (25, 10, 1)


@pytest.mark.parametrize("name", ["forecaster", "tcn", "transformer", "gru"])
def test_window_models_reject_flat_inputs(name):
    with pytest.raises(ValueError, match=r"input_shape must be \(L, F\)"):
        build_model(name, (1,), (1,))


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [
        ("mlp", {"hidden_sizes": (40, 0)}, "hidden_sizes"),
        ("mlp", {"activation": "sigmoidish"}, "activation"),
        ("mlp", {"dropout": 1.5}, "dropout"),
        ("tcn", {"channels": 0}, "channels"),
        ("tcn", {"kernel_size": 0}, "kernel_size"),
        ("transformer", {"d_model": 30, "num_heads": 4}, "d_model"),
        ("gru", {"hidden_size": 0}, "hidden_size"),
    ],
)
def test_bad_options_name_the_field(name, options, field):
    with pytest.raises(ValueError, match=field):
        build_model(name, WINDOW, HORIZON, **options)


def test_bad_shapes_and_unknown_names():
    with pytest.raises(ValueError, match="input_shape"):
        build_model("mlp", (0,), (1,))
    with pytest.raises(ValueError, match="output_shape"):
        build_model("mlp", (1,), ())
    with pytest.raises(ValueError, match="unknown model 'resnet'; registered: forecaster"):
        get_model("resnet")


def test_registry_accepts_user_models_and_rejects_clashes(monkeypatch):
    from metadist import models

    monkeypatch.setattr(models.MODELS, "_classes", dict(models.MODELS._classes))  # leave no trace

    @register_model("test_linear")
    class Linear(nn.Module):
        def __init__(self, input_shape, output_shape):
            super().__init__()
            self.head = nn.Linear(input_shape[-1], output_shape[-1])

        def forward(self, x):
            return self.head(x)

    assert build_model("test_linear", (3,), (2,))(torch.randn(4, 3)).shape == (4, 2)
    with pytest.raises(ValueError, match="already registered"):

        @register_model("mlp")
        class Other(nn.Module):
            pass

    with pytest.raises(TypeError):
        register_model("not_a_module")(object)


def _transform_targets(x, channels, a, b):
    """`a · x + b` on the target channels of windows `x [..., L, F]`, others unchanged."""
    x = x.clone()
    x[..., channels] = a * x[..., channels] + b
    return x


@pytest.mark.parametrize("name", ["forecaster", "tcn", "nbeats"])
@pytest.mark.parametrize("mode", ["last", "mean"])
@pytest.mark.parametrize(
    ("window", "horizon", "channels"),
    [((6, 1), (3, 1), None), ((6, 2), (3, 2), [1, 0]), ((6, 3), (3, 1), [2])],
    ids=["one_feature", "two_targets_swapped", "target_and_covariates"],
)
def test_window_norm_is_affine_equivariant(name, mode, window, horizon, channels):
    """Forecasting `a · x + b` gives `a · f(x) + b` per target; without window_norm it does not."""
    torch.manual_seed(0)
    options = {"target_channels": channels} if channels is not None else {}
    model = build_model(name, window, horizon, window_norm=mode, **options).double()
    plain = build_model(name, window, horizon).double()
    x = torch.randn(4, 5, *window, dtype=torch.float64)
    targets = list(range(window[1])) if channels is None else channels
    a = torch.tensor([3.0, 0.5], dtype=torch.float64)
    b = torch.tensor([100.0, -7.0], dtype=torch.float64)
    a, b = a[: len(targets)], b[: len(targets)]
    shifted = _transform_targets(x, targets, a, b)
    torch.testing.assert_close(model(shifted), a * model(x) + b)
    assert not torch.allclose(plain(shifted), a * plain(x) + b, atol=1e-3)


def test_window_norm_leaves_covariates_unscaled():
    """Only target channels are normalised: a covariate shift changes the forecast."""
    torch.manual_seed(0)
    model = build_model("forecaster", (6, 2), (3, 1), window_norm="last", target_channels=[0])
    x = torch.randn(2, 6, 2)
    moved = x.clone()
    moved[..., 1] += 5.0
    assert not torch.allclose(model(x), model(moved), atol=1e-3)


@pytest.mark.parametrize("mode", ["last", "mean"])
def test_window_norm_keeps_windows_of_large_values_finite_in_float32(mode):
    """Squares of deviations of 1e21 overflow float32: taken relative to the window's
    reference (as the seasonal norm does), the forecast stays finite and equivariant."""
    torch.manual_seed(0)
    model = build_model("forecaster", (6, 1), (3, 1), window_norm=mode)
    x = torch.randn(2, 6, 1)
    large = model(x * 1e21 + 3e21)
    assert torch.isfinite(large).all()
    torch.testing.assert_close(large / 1e21, model(x) + 3.0, rtol=1e-4, atol=1e-4)


def test_window_norm_flat_windows_forecast_their_level():
    """A constant window has no scale: the clamp keeps it finite and the forecast is ~ the level."""
    model = build_model("forecaster", (6, 1), (3, 1), window_norm="mean")
    x = torch.full((2, 6, 1), 4200.0)
    out = model(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.full_like(out, 4200.0), rtol=1e-4, atol=0.0)


def test_window_norm_batched_forward_normalises_each_task():
    """The learners' native batched path (parameters `[B, ...]`) window-normalises too:
    it equals the per-task model and is equivariant."""
    from metadist.learners.base import has_batched_forward

    torch.manual_seed(0)
    model = build_model(
        "forecaster", (6, 2), (3, 1), hidden_sizes=(8,), window_norm="mean", target_channels=[1]
    ).double()
    assert has_batched_forward(model)
    params = {
        n: p.detach() + 0.1 * torch.randn(4, *p.shape, dtype=p.dtype)
        for n, p in model.named_parameters()
    }
    x = torch.randn(4, 7, 6, 2, dtype=torch.float64)
    batched = model.batched_forward(params, x)
    for b in range(4):
        expected = torch.func.functional_call(model, {n: p[b] for n, p in params.items()}, x[b])
        torch.testing.assert_close(batched[b], expected)
    shifted = _transform_targets(x, [1], 2.5, -40.0)
    torch.testing.assert_close(model.batched_forward(params, shifted), 2.5 * batched - 40.0)


@pytest.mark.parametrize(
    ("window", "horizon", "options", "match"),
    [
        ((6, 1), (3, 1), {"window_norm": "max"}, "window_norm must be one of none, last, mean"),
        ((6, 1), (4,), {"window_norm": "last"}, r"output_shape must be \(H, T\)"),
        ((6, 2), (3, 1), {"window_norm": "last"}, "needs target_channels"),
        ((6, 2), (3, 1), {"window_norm": "last", "target_channels": [2]}, "target_channels"),
        ((6, 2), (3, 2), {"window_norm": "mean", "target_channels": [0, 0]}, "distinct"),
        ((6, 2), (3, 2), {"window_norm": "mean", "target_channels": [0]}, "target_channels"),
    ],
)
@pytest.mark.parametrize("name", ["forecaster", "tcn", "nbeats"])
def test_bad_window_norm_options_name_the_field(name, window, horizon, options, match):
    with pytest.raises(ValueError, match=match):
        build_model(name, window, horizon, **options)


def test_the_written_out_gru_equals_torchs_with_vmap_and_second_derivatives():
    from torch.func import functional_call, grad, vmap

    from metadist.models.gru import gru_recurrence

    class WrittenOut(nn.Module):
        def __init__(self, gru):
            super().__init__()
            self.gru = gru

        def forward(self, x):
            return gru_recurrence(self.gru, x)

    torch.manual_seed(0)
    gru = nn.GRU(3, 5, num_layers=2, batch_first=True)
    written = WrittenOut(gru)
    x = torch.randn(4, 7, 3)
    params = {k: v.detach() for k, v in gru.named_parameters()}

    def fused(p, xs):
        return functional_call(gru, p, (xs,))[0]

    def by_hand(p, xs):
        return functional_call(written, {f"gru.{k}": v for k, v in p.items()}, (xs,))

    torch.testing.assert_close(gru_recurrence(gru, x), gru(x)[0], rtol=1e-5, atol=1e-6)
    # first and second derivatives (MAML's) equal the fused kernel's
    for order in (1, 2):
        results = []
        for fn in (fused, by_hand):
            g = grad(lambda p, fn=fn: (fn(p, x) ** 2).mean())
            if order == 2:
                g = grad(lambda p, g=g: sum((v**2).sum() for v in g(p).values()))
            results.append(g(params))
        for k in params:
            torch.testing.assert_close(results[1][k], results[0][k], rtol=1e-4, atol=1e-6)
    # batched over tasks' own weights (a learner's inner loop) equals one task at a time
    stacked = {k: v + 0.01 * torch.randn(3, *v.shape) for k, v in params.items()}
    xs = torch.randn(3, 4, 7, 3)
    batched = vmap(by_hand)(stacked, xs)
    for i in range(3):
        single = fused({k: v[i] for k, v in stacked.items()}, xs[i])
        torch.testing.assert_close(batched[i], single, rtol=1e-5, atol=1e-6)
