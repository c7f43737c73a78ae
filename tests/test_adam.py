"""`metadist.train.adam.Adam`: torch.optim.Adam's update bit for bit, its state_dict
format both ways, and no `torch._dynamo` import where it replaces torch.optim.Adam."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from metadist.train.adam import Adam, has_fused_adam


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3), nn.Linear(3, 3))


def _loss(model: nn.Module, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(16, 6, generator=generator).to(model[0].weight.dtype)
    # the last layer is used on odd steps only: a parameter without a gradient is skipped
    hidden = model[2](model[1](model[0](x)))
    return (model[3](hidden) if step % 2 else hidden).square().mean()


def _train(model, optimizer, steps, start=0):
    for step in range(start, steps):
        optimizer.zero_grad(set_to_none=True)
        _loss(model, step).backward()
        optimizer.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adam_equals_torch_adam_bit_for_bit(dtype):
    ours, theirs = _model().to(dtype), _model().to(dtype)
    _train(ours, Adam(ours.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-6), 9)
    reference = torch.optim.Adam(theirs.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    _train(theirs, reference, 9)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)


def test_state_dict_is_torch_adams_format_both_ways():
    """Four steps with one, the state handed to the other, four more: as eight with
    torch.optim.Adam alone (either direction)."""
    reference = _model()
    _train(reference, torch.optim.Adam(reference.parameters(), lr=0.01), 8)
    for first, second in ((Adam, torch.optim.Adam), (torch.optim.Adam, Adam)):
        model = _model()
        before = first(model.parameters(), lr=0.01)
        _train(model, before, 4)
        after = second(model.parameters(), lr=0.01)
        after.load_state_dict(before.state_dict())
        _train(model, after, 8, start=4)
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(a, b)


def test_fused_adam_equals_torch_fused_adam():
    if not has_fused_adam(torch.device("cpu"), torch.float32):
        pytest.skip("no fused Adam kernel on this CPU build")
    ours, theirs = _model(), _model()
    _train(ours, Adam(ours.parameters(), lr=0.01, fused=True), 5)
    _train(theirs, torch.optim.Adam(theirs.parameters(), lr=0.01, fused=True), 5)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)


def test_bad_settings_and_a_foreign_state_are_named():
    params = list(_model().parameters())
    with pytest.raises(ValueError, match="lr must be > 0"):
        Adam(params, lr=0)
    with pytest.raises(ValueError, match="betas"):
        Adam(params, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="the state has 1 parameters"):
        Adam(params).load_state_dict(torch.optim.Adam(params[:1]).state_dict())


PROBE = textwrap.dedent(
    """
    import sys
    import torch
    from metadist.eval import baselines
    from metadist.eval.baseline_pp import cosine_classifier_scores

    def examples(num, seed):
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(num, 4, 2, generator=generator), torch.arange(num) % 3

    backbone = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 5))
    baselines.pretrain_embedding(
        backbone, examples, num_classes=3, embedding_size=5, steps=3, lr=0.01, batch_size=6
    )
    x = torch.randn(2, 6, 4, 2)
    cosine_classifier_scores(backbone, x, torch.arange(6).repeat(2, 1) % 3, x, 3, steps=2)
    baselines.fit_from_scratch(backbone, x, torch.arange(6).repeat(2, 1) % 3, steps=2,
                               lr=0.01, loss="cross_entropy")
    print("dynamo imported:", "torch._dynamo" in sys.modules)
    """
)


def test_the_baselines_training_does_not_import_torch_dynamo():
    """The pretrained embedding, Baseline++ and the from-scratch network train without
    the `torch._dynamo` import a first `torch.optim.Adam` costs (seconds)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dynamo imported: False" in done.stdout
