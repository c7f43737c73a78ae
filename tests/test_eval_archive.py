"""`metadist eval` keeps evaluations side by side: `eval/metrics.json` is the latest, an
earlier one with other settings moves to `eval/<its key>/`, none is overwritten."""

import json
import subprocess
import sys

import pytest

from metadist.eval import evaluate_run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from metadist.train import load_config, train

    run = tmp_path_factory.mktemp("archive") / "run"
    overrides = [
        "experiment=sinusoid_maml",
        "sampler.options.num_tasks=40",
        "model.options.hidden_sizes=[8]",
        "trainer.meta_batch_size=4",
        "trainer.meta_steps=2",
        "trainer.eval_every=0",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        f"run_dir={run}",
    ]
    train(load_config(overrides, world_size=1))
    return run


def summary(path):
    return json.loads((path / "metrics.json").read_text())


def test_a_second_evaluation_with_other_settings_keeps_the_first(run_dir):
    quick = ["eval.scratch_steps=0", "eval.max_tasks=2", "eval.batch_size=2"]
    first = evaluate_run(run_dir, overrides=quick, progress=False)
    assert "previous evaluation" not in first["paths"]
    again = evaluate_run(run_dir, overrides=quick, progress=False)  # the same settings
    assert "previous evaluation" not in again["paths"]
    assert sorted(p.name for p in (run_dir / "eval").iterdir() if p.is_dir()) == []
    other = evaluate_run(run_dir, overrides=[*quick, "eval.max_tasks=4"], progress=False)
    kept = run_dir / "eval" / first["evaluation"]
    assert other["paths"]["previous evaluation"] == str(kept)
    assert other["evaluation"] != first["evaluation"]
    assert other["evaluation"].startswith("step_00000002-")
    assert summary(run_dir / "eval")["num_tasks"] == 4  # eval/metrics.json: the latest
    assert summary(kept)["num_tasks"] == 2 and summary(kept)["evaluation"] == first["evaluation"]
    assert (kept / "metrics.md").is_file() and (kept / "tasks.parquet").is_file()

    # one written before evaluations recorded their key is kept too
    legacy = summary(run_dir / "eval")
    del legacy["evaluation"]
    (run_dir / "eval" / "metrics.json").write_text(json.dumps(legacy))
    done = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "eval", f"run_dir={run_dir}", *quick],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    moved = [line for line in done.stdout.splitlines() if line.startswith("previous evaluation")]
    assert len(moved) == 1 and "/eval/earlier-" in moved[0]
    earlier = run_dir / "eval" / moved[0].split(": ", 1)[1].rsplit("/", 1)[1]
    assert summary(earlier)["num_tasks"] == 4
    assert summary(run_dir / "eval")["num_tasks"] == 2
    assert len([p for p in (run_dir / "eval").iterdir() if p.is_dir()]) == 2
