"""The evaluation's cost line (said before it starts) and its settings line (only the
settings that apply)."""

from __future__ import annotations

from types import SimpleNamespace

from torch import nn

from metadist.eval.cost import QUICK_TASKS, adaptation_steps, cost_line
from metadist.eval.scoring import _settings
from metadist.eval.settings import EvalOptions


def test_a_ucr_evaluation_states_its_cost_and_a_quick_check():
    options = EvalOptions(scratch_steps=100, pretrain_steps=600)
    line = cost_line(options, 1000, inner_steps=None, scratch=True, pretrained=True)
    assert line.startswith(
        "evaluation: 1000 tasks, each from scratch 100 steps, Baseline++ 100 steps "
        "(200,000 task-steps in all); pretrained embedding: 600 steps once"
    )
    assert f"A quick check: eval.max_tasks={QUICK_TASKS} eval.scratch_steps=10" in line


def test_a_small_evaluation_suggests_nothing_and_counts_the_inner_steps():
    options = EvalOptions(scratch_steps=5)
    line = cost_line(options, 10, inner_steps=3, scratch=True, pretrained=False)
    assert line.startswith(
        "evaluation: 10 tasks, each meta-learner 3 adaptation step(s), from scratch 5 steps "
        "(80 task-steps in all)"
    )
    assert "quick check" not in line and "pretrained" not in line


def test_settings_leave_out_what_does_not_apply():
    protonet_like = nn.Linear(1, 1)  # no eval_inner_steps: no inner loop
    options = EvalOptions(scratch_steps=0)
    settings = _settings("classification", options, protonet_like)
    assert "inner_steps" not in settings
    assert "seasonal_period" not in settings and "scratch_lr" not in settings
    assert settings["scratch_steps"] == 0
    maml_like = nn.Linear(1, 1)
    maml_like.eval_inner_steps = 5
    forecast = _settings("forecast", EvalOptions(scratch_steps=50), maml_like)
    assert forecast["inner_steps"] == 5 and forecast["seasonal_period"] == 1
    assert forecast["scratch_lr"] == EvalOptions().scratch_lr


def test_adaptation_steps_of_each_kind_of_learner():
    options = EvalOptions()
    assert adaptation_steps(nn.Linear(1, 1), options) is None  # protonet, metabaseline
    ft_like = SimpleNamespace(options=SimpleNamespace(inner_steps=5))
    assert adaptation_steps(ft_like, options) == 5  # metabaseline_ft: its head's steps
    maml_like = SimpleNamespace(eval_inner_steps=3, options=SimpleNamespace(inner_steps=1))
    assert adaptation_steps(maml_like, options) == 3
    assert adaptation_steps(maml_like, EvalOptions(inner_steps=7)) == 7
