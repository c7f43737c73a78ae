"""What `trainer.compile=true` says: that it compiles and how long that took, or at once
why it runs eagerly where a double backward through autograd's backward is needed."""

from __future__ import annotations

import pytest
import torch
from sinusoid_batches import sinusoid_batches
from torch import nn

from metadist.learners import build_learner
from metadist.models import build_model
from metadist.train.compile_check import cannot_compile_reason
from metadist.train.distributed import DistEnv
from metadist.train.step import MetaStep

pytestmark = pytest.mark.usefixtures("one_thread")


def _batches(num, num_tasks=4):
    return sinusoid_batches(num, num_tasks)


def _learner(model_name, learner_name="maml", **options):
    """`mlp`: the shipped MLP (its backward written out); `plain`: the same layers as a
    user's own module, which has none."""
    torch.manual_seed(0)
    if model_name == "mlp":
        model = build_model("mlp", (1,), (1,), hidden_sizes=(8,))
    else:
        model = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1))
    return build_learner(learner_name, model, **options)


@pytest.mark.parametrize(
    "model_name, learner_name, options, can_try",
    [
        ("mlp", "maml", {"inner_steps": 1}, True),  # the written-out backward
        ("plain", "maml", {"inner_steps": 1}, False),  # second order through autograd
        ("plain", "maml", {"inner_steps": 1, "first_order": True}, True),
        ("plain", "maml", {"inner_steps": 1, "first_order_steps": 5}, False),  # later
        ("plain", "metasgd", {"inner_steps": 1}, False),
        ("plain", "reptile", {}, True),  # first order by construction
        ("mlp", "maml", {"inner_steps": 1, "vectorize": False}, False),  # per task
    ],
)
def test_the_reason_is_known_up_front(model_name, learner_name, options, can_try):
    reason = cannot_compile_reason(_learner(model_name, learner_name, **options))
    assert (reason is None) == can_try, reason
    if reason is not None:
        assert "double backward" in reason


def test_a_second_order_learner_without_written_out_backward_skips_compiling(monkeypatch):
    def never(fn, **kwargs):
        raise AssertionError("torch.compile must not be called")

    monkeypatch.setattr(torch, "compile", never)
    learner = _learner("plain", inner_steps=1)
    opt = torch.optim.Adam(learner.parameters(), lr=1e-2)
    messages = []
    meta_step = MetaStep(learner, learner, opt, DistEnv(), compile=True, message=messages.append)
    assert not meta_step.compiled
    assert len(messages) == 1
    assert messages[0].startswith("trainer.compile: not compiling the meta-step (second-order")
    assert messages[0].endswith("; running eagerly")
    assert meta_step(_batches(1)[0], 0, 1e-2, sync=True).bad_step is None
    assert len(messages) == 1  # nothing more after a step


def test_compiling_says_so_before_and_the_compile_time_after(monkeypatch):
    compiled_calls = []

    def fake_compile(fn, **kwargs):
        def call(*args):
            compiled_calls.append(len(args))
            return fn(*args)

        return call

    monkeypatch.setattr(torch, "compile", fake_compile)
    learner = _learner("mlp", inner_steps=1)
    opt = torch.optim.Adam(learner.parameters(), lr=1e-2)
    messages = []
    meta_step = MetaStep(learner, learner, opt, DistEnv(), compile=True, message=messages.append)
    assert meta_step.compiled
    assert messages == ["trainer.compile: compiling the meta-step; the first steps take longer"]
    data = _batches(3)
    meta_step(data[0], 0, 1e-2, sync=True)  # eager: the learner's one-time decisions
    assert len(messages) == 1 and not compiled_calls
    meta_step(data[1], 1, 1e-2, sync=True)  # the first compiled call
    assert len(compiled_calls) == 1 and len(messages) == 2
    assert messages[1].startswith("trainer.compile: compiled the meta-step in ")
    assert messages[1].endswith(" s")
    meta_step(data[2], 2, 1e-2, sync=True)
    assert len(compiled_calls) == 2 and len(messages) == 2  # said once
