"""What an evaluation will cost, said before it starts: episodes times the optimizer
steps of each method that trains per episode, and the steps trained once."""

from __future__ import annotations

from typing import Any

from metadist.eval import baseline_pp
from metadist.eval.settings import EvalOptions


def adaptation_steps(learner: Any, options: EvalOptions) -> int | None:
    """The steps the meta-learner adapts each task with: `eval.inner_steps`, else the
    learner's `eval_inner_steps` (the MAML family), else its options' `inner_steps`
    (`metabaseline_ft`); `None` for a learner without an inner loop (protonet)."""
    if options.inner_steps is not None:
        return options.inner_steps
    steps = getattr(learner, "eval_inner_steps", None)
    if steps is None:
        steps = getattr(getattr(learner, "options", None), "inner_steps", None)
    return steps


def adaptation_steps_by_shots(learner: Any, options: EvalOptions) -> dict[int, int] | None:
    """The learner's eval-mode step counts by shot count (`maml`'s
    `eval_inner_steps_by_shots`), which take the place of `adaptation_steps` in episodes
    of those shot counts; `None` where there are none or `eval.inner_steps` overrides."""
    by_shots = getattr(learner, "eval_steps_by_shots", None)
    return dict(by_shots) if by_shots and options.inner_steps is None else None


def cost_line(
    options: EvalOptions,
    num_tasks: int,
    *,
    inner_steps: int | None,
    scratch: bool,
    pretrained: bool,
) -> str:
    """One line: the tasks evaluated and what each costs, with the overrides of a quick
    check where the evaluation is large.

    Args:
        options: the evaluation settings.
        num_tasks: tasks (episodes, series) to be scored.
        inner_steps: the meta-learner's adaptation steps per task (`None`: it has none).
        scratch: whether the from-scratch baseline runs (`eval.scratch_steps` per task).
        pretrained: whether the pretrained-embedding baseline (and Baseline++ on it) runs.
    """
    per_task = []
    if inner_steps is not None:
        per_task.append(f"meta-learner {inner_steps} adaptation step(s)")
    if scratch:
        per_task.append(f"from scratch {options.scratch_steps} steps")
    if pretrained:
        per_task.append(f"Baseline++ {baseline_pp.STEPS} steps")
    total = num_tasks * sum(
        [inner_steps or 0, options.scratch_steps if scratch else 0]
        + [baseline_pp.STEPS if pretrained else 0]
    )
    line = f"evaluation: {num_tasks} tasks"
    if per_task:
        line += f", each {', '.join(per_task)} ({total:,} task-steps in all)"
    if pretrained:
        line += f"; pretrained embedding: {options.pretrain_steps} steps once"
    line += "; fewer where an earlier evaluation's baselines are reused"
    if num_tasks > QUICK_TASKS:
        line += f". A quick check: eval.max_tasks={QUICK_TASKS}" + (
            " eval.scratch_steps=10" if scratch and options.scratch_steps > 10 else ""
        )
    return line


# tasks above which the line suggests a quick check with fewer
QUICK_TASKS = 64
