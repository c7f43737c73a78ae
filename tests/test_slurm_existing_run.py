"""`metadist slurm submit` into a run directory that holds a run of other settings: one
line naming the setting, before anything is printed, written or submitted (the job's
training refused to resume it only once the job had left the queue)."""

from __future__ import annotations

import os

import pytest

from metadist.cli import main
from metadist.train.__main__ import main as train_main

pytestmark = pytest.mark.integration

TINY = [
    "experiment=sinusoid_maml",
    "trainer.meta_steps=2",
    "trainer.meta_batch_size=2",
    "trainer.eval_every=0",
    "logging.progress=false",
    "logging.wandb.mode=disabled",
]


@pytest.mark.timeout(300)
def test_a_run_of_other_settings_is_refused_before_submitting(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    assert train_main([*TINY, f"run_dir={run_dir}", "--no-eval"]) == 0
    # an sbatch that leaves a mark: the refusal must come before it is called
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "sbatch-called"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f"#!/bin/sh\ntouch {called}\necho 1\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    capsys.readouterr()

    other = [*TINY, "learner.options.inner_lr=0.5", f"run_dir={run_dir}"]
    for extra in (["--dry-run"], []):
        assert main(["slurm", "submit", *other, *extra]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("metadist slurm: error: "), err
        assert "learner.options.inner_lr=0.01" in err[0], err
        assert "learner.options.inner_lr=0.5" in err[0] and "run_dir=" in err[0], err
    assert not called.exists()
    assert not (run_dir / "slurm").exists()

    # the same settings resume the run: the script is printed as before
    assert main(["slurm", "submit", *TINY, f"run_dir={run_dir}", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("#!/bin/bash\n")
