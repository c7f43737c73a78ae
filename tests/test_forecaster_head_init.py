"""The forecaster's `head_init`: "zero" starts the output layer at zero, so that the
untrained seasonal forecaster is seasonal naive and training learns a correction; the
default keeps PyTorch's initialisation; anything else is named."""

import pytest
import torch

from metadist.models import build_model
from metadist.train.compose import compose_dict

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(head_init="zero", **options):
    torch.manual_seed(0)
    options = {"window_norm": "seasonal", "hidden_sizes": (8,), "seasonal_period": 4, **options}
    return build_model("forecaster", (16, 1), (8, 1), head_init=head_init, **options).double()


def test_a_zero_head_forecasts_seasonal_naive_before_any_training():
    t = torch.arange(16 + 8, dtype=torch.float64)
    season = torch.tensor([0.8, 1.3, 1.2, 0.7], dtype=torch.float64)
    whole = 50.0 * season[t.long() % 4]  # purely seasonal: seasonal naive is exact
    x, expected = whole[:16].reshape(1, 16, 1), whole[16:].reshape(1, 8, 1)
    torch.testing.assert_close(_model()(x), expected, rtol=1e-12, atol=1e-10)
    # the default head is PyTorch's: the same window is not forecast exactly
    assert not torch.allclose(_model("default")(x), expected, rtol=1e-6)


def test_a_zero_head_still_learns():
    model = _model().float()
    x, y = torch.rand(4, 3, 16, 1) + 1.0, torch.rand(4, 3, 8, 1) + 1.0
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # the first step moves the head, the second the body through it
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    moved = {k for k, v in model.named_parameters() if not torch.equal(v, before[k])}
    assert moved == set(before)


def test_a_bad_head_init_is_named():
    with pytest.raises(ValueError, match="head_init must be one of default, zero, got 'ones'"):
        _model("ones")


def test_the_cpu_recipe_takes_it_as_a_plain_override():
    composed = compose_dict(["experiment=competition_cpu", "model.options.head_init=zero"])
    assert composed["model"]["options"]["head_init"] == "zero"
    assert (
        compose_dict(["experiment=competition_cpu"])["model"]["options"]["head_init"] == "default"
    )
