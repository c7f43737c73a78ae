"""`metadist sweep --launcher slurm --slurm python=PATH`: the interpreter was neither
checked (as `metadist slurm submit python=` is) nor used: every wave's array job ran the
sweep's own interpreter. It is checked before anything is created, and the waves run it
(tests/test_slurm_cluster.py runs one on a real cluster)."""

from __future__ import annotations

import os
import sys

import pytest

from metadist.cli import main
from metadist.launch.sweep import SweepSettings
from metadist.launch.sweep.runners import SlurmArrayWave
from metadist.launch.sweep.settings import TrialPlan

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
@pytest.mark.parametrize("python", ["/nowhere/bin/python", "pyhton3", "venv/bin/python"])
def test_an_interpreter_that_is_not_there_is_refused_before_the_sweep(
    tmp_path, monkeypatch, capsys, python
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "sbatch-called"
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {called}\necho 1\n")
    for name in ("squeue", "scancel"):  # a job that went (what the check must prevent)
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
    for program in bin_dir.iterdir():
        program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text("optimizer.lr: {type: float, low: 0.001, high: 0.01}\n")
    sweep_dir = tmp_path / "sweep"
    command = [
        *["sweep", "experiment=sinusoid_maml", "trainer.meta_steps=4"],
        *["trainer.meta_batch_size=4", "trainer.eval_every=2", "--space", "space.yaml"],
        *["--sweep-dir", str(sweep_dir), "--launcher", "slurm", "--slurm", "gpus_per_node=0"],
    ]
    assert main([*command, "--slurm", f"python={python}"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert err == [
        f"metadist sweep: error: --slurm python={python!r}: no such program from here (the "
        f"nodes run it from a shared file system, in the working directory {tmp_path}); name "
        "the interpreter that has metadist, or leave python= out for the one running this "
        "command"
    ], err
    assert not sweep_dir.exists() and not called.exists()


@pytest.mark.timeout(60)
def test_the_waves_script_runs_the_interpreter_given(tmp_path, monkeypatch):
    """A wave's array job is written with `--slurm python=` (sbatch, outside the test,
    is a stand-in that takes the script and answers a job id)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 7\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / "venv" / "bin" / "python")
    overrides = ["experiment=sinusoid_maml"]
    plan = TrialPlan(0, 0, {}, tmp_path / "trial", overrides, 4)
    for given, expected in (([], sys.executable), (["python=venv/bin/python"], "venv/bin/python")):
        settings = SweepSettings(
            overrides=overrides,
            space=[],
            sweep_dir=tmp_path / "sweep",
            launcher="slurm",
            slurm_settings=["gpus_per_node=0", *given],
        )
        settings.validate()
        wave = SlurmArrayWave([plan], settings, 0)
        script = (wave.wave_dir / "job.sbatch").read_text()
        (line,) = [x.strip() for x in script.splitlines() if "-m metadist.launch.torchrun" in x]
        assert line.startswith(f"{expected} -m metadist.launch.torchrun"), line
