"""A run whose own evaluation settings name ensemble members (`eval.ensemble`, paths from
where it was trained), moved elsewhere together with them: it loads, forecasts and
evaluates from any working directory, its members found from where the run now is.

Real parts: a tiny store, two runs of two meta-steps trained by `metadist train` from a
project directory with relative paths (the second with `eval.ensemble=[runs/a]`), the
project copied elsewhere and the original deleted.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tiny_runs import tiny_store

import metadist
from metadist.cli import main
from metadist.datasets.synthetic import SYNTHETIC_ENTITY
from metadist.eval import evaluate_run
from metadist.eval.ensemble_paths import members_from_run, trained_from
from metadist.learners.ensemble import LearnerEnsemble

pytestmark = pytest.mark.integration
TRAIN = ["experiment=synthetic_maml", "data.store=store", "trainer.meta_steps=2",
         "trainer.meta_batch_size=2", "trainer.eval_every=0", "trainer.seed=3",
         "logging.wandb.mode=disabled", "logging.progress=false"]  # fmt: skip
EVAL = ["eval.scratch_steps=0", "eval.max_tasks=4", "eval.group_by=[]", "eval.num_examples=0"]


def test_where_a_run_was_trained_from():
    assert trained_from("/copy/runs/a", "runs/a") == Path("/copy")
    assert trained_from("../p/ens", "ens") == Path("../p")
    assert trained_from("ens", "ens") == Path(".")
    assert trained_from("/copy/a", "/abs/a") is None
    assert trained_from("/copy/a", "../a") is None


@pytest.mark.timeout(300)
def test_a_moved_run_finds_the_ensemble_members_its_settings_name(tmp_path, monkeypatch):
    project = tmp_path / "project"
    tiny_store(project, num_entities=12, seed=4)
    panel = pq.read_table(project / "panel")
    history = panel.filter(pc.equal(panel[SYNTHETIC_ENTITY], panel[SYNTHETIC_ENTITY][0]))
    monkeypatch.chdir(project)
    assert main(["train", *TRAIN, "run_dir=runs/a", "--no-eval"]) == 0
    # the same split, another learning rate: a member that saw no evaluated entity
    assert main(["train", *TRAIN, *EVAL, "run_dir=runs/b", "optimizer.lr=0.003",
                 "eval.ensemble=[runs/a]"]) == 0  # fmt: skip
    before = metadist.load_run("runs/b").forecast(history, methods=["adapted"])

    copy = tmp_path / "copy"
    shutil.copytree(project, copy)
    shutil.rmtree(project)  # neither the original runs nor the store are there
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    run = metadist.load_run(copy / "runs" / "b")
    assert isinstance(run.learner, LearnerEnsemble) and len(run.learner.members) == 2
    assert run.forecast(history, methods=["adapted"]).equals(before)
    # through a link to the run directory: from where the link points
    (work / "link").symlink_to(copy / "runs" / "b")
    linked = metadist.load_run(work / "link")
    assert isinstance(linked.learner, LearnerEnsemble)
    # the store copied beside it is found too: the evaluation names the member there
    result = evaluate_run(copy / "runs" / "b", write=False, progress=False)
    assert str(copy / "runs" / "a") in result["settings"]["ensemble"]
    # from the directory it was trained from, the settings read as written
    monkeypatch.chdir(copy)
    assert members_from_run("runs/b", "runs/b", ["runs/a"]) == ["runs/a"]
