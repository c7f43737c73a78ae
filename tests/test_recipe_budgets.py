"""The UCR recipes' pretrained-embedding baseline keeps the meta-learner's budget under
overrides, and where the recipes expect their store is where the docs' commands put it."""

from __future__ import annotations

from pathlib import Path

import pytest

from metadist.train.compose import compose_dict, find_experiments_dir

EXPERIMENTS = find_experiments_dir()
UCR = sorted(p.stem for p in (EXPERIMENTS / "experiment").glob("ucr_*.yaml"))


def test_there_are_ucr_recipes():
    assert {"ucr_protonet", "ucr_maml", "ucr_metabaseline", "ucr_metabaseline_ft"} <= set(UCR)


@pytest.mark.parametrize("experiment", UCR)
def test_pretrained_baseline_budget_follows_overrides(experiment):
    shipped = compose_dict([f"experiment={experiment}"])
    budget = shipped["pretrain"]["steps"] + shipped["trainer"]["meta_steps"]
    assert shipped["eval"]["pretrain_steps"] == budget
    tiny = compose_dict([f"experiment={experiment}", "trainer.meta_steps=20", "pretrain.steps=20"])
    assert tiny["eval"]["pretrain_steps"] == 40
    only_meta = compose_dict([f"experiment={experiment}", "trainer.meta_steps=7"])
    assert only_meta["eval"]["pretrain_steps"] == shipped["pretrain"]["steps"] + 7


def test_an_explicit_pretrain_steps_still_wins():
    values = compose_dict(["experiment=ucr_metabaseline", "eval.pretrain_steps=5"])
    assert values["eval"]["pretrain_steps"] == 5


def test_metabaseline_budget_is_600_as_documented():
    values = compose_dict(["experiment=ucr_metabaseline"])
    assert values["eval"]["pretrain_steps"] == 600
    assert Path(EXPERIMENTS / "experiment" / "ucr_metabaseline.yaml").is_file()
