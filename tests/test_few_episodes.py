"""A few-shot evaluation of fewer than 100 episodes says, in its report, that its figures
are for checking (`metadist.eval.few_episodes`)."""

from __future__ import annotations

import json

import pytest
from tiny_runs import train_tiny, ucr_store

from metadist.eval.run import evaluate_run

SET = "UnitTest"  # 42 cases, 2 classes: its meta-test split holds 21 cases


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("few-episodes")
    store = ucr_store(tmp, SET)
    return train_tiny(store, tmp / "run", "experiment=ucr_protonet")


def _evaluate(run_dir, *overrides):
    result = evaluate_run(
        run_dir, overrides=["eval.scratch_steps=1", *overrides], progress=False, cache=False
    )
    markdown = (run_dir / "eval" / "metrics.md").read_text()
    saved = json.loads((run_dir / "eval" / "metrics.json").read_text())
    return result, markdown, saved["settings"].get("episodes")


def test_few_episodes_are_said_to_be_for_checking(run_dir):
    result, markdown, saved = _evaluate(run_dir, "eval.max_tasks=8")
    assert result["num_tasks"] == 8
    said = result["settings"]["episodes"]
    assert said.startswith("only 8 scored: for checking, not for reporting (fewer than 100")
    assert "normal approximation understates" in said and said.endswith("scores more)")
    assert f"episodes: {said}" in markdown and saved == said
    # the split gives 21 episodes, one per unit: more come from more per unit
    result, _, _ = _evaluate(run_dir, "eval.tasks_per_unit=1", "eval.max_tasks=1000")
    assert result["num_tasks"] == 21
    assert "the split gives no more: eval.tasks_per_unit" in result["settings"]["episodes"]


def test_enough_episodes_carry_no_note(run_dir):
    result, markdown, saved = _evaluate(run_dir, "eval.tasks_per_unit=5", "eval.max_tasks=1000")
    assert result["num_tasks"] == 105 and "episodes" not in result["settings"]
    assert "episodes:" not in markdown and saved is None


def test_the_note_starts_below_the_bound():
    from metadist.eval.few_episodes import FEW_EPISODES, few_episodes_note

    assert few_episodes_note(FEW_EPISODES, 1000) is None
    below = few_episodes_note(FEW_EPISODES - 1, 1000)
    assert below is not None and "understates" not in below
    assert "understates" in str(few_episodes_note(29, None))
