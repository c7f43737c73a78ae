"""The built wheel, installed into a fresh venv, runs a shipped experiment from anywhere.

The wheel is built from this checkout and installed with `--no-deps` into a new virtual
environment that sees this test environment's dependencies (torch and the rest) through a
`.pth` file, so nothing is downloaded. From an empty directory, away from the source
checkout, `metadist train` must find the experiment configs shipped inside the package,
and `metadist eval` must re-score the run with the settings the run recorded.
"""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


def _run(command: list, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "METADIST_EXPERIMENTS_DIR")
    }
    env["WANDB_MODE"] = "disabled"
    return subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.timeout(600)
def test_the_wheel_runs_a_shipped_experiment_from_any_directory(tmp_path):
    wheels = tmp_path / "wheels"
    built = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            wheels,
            ROOT,
        ],
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("metadist-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "metadist/_experiments/config.yaml" in names
    assert "metadist/_experiments/experiment/sinusoid_maml.yaml" in names

    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path
    )
    (Path(purelib.stdout.strip()) / "_test_env_deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    installed = _run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel], cwd=tmp_path
    )
    assert installed.returncode == 0, installed.stderr[-2000:]

    work = tmp_path / "elsewhere"
    work.mkdir()
    metadist = venv / "bin" / "metadist"
    where = _run([python, "-c", "import metadist; print(metadist.__file__)"], cwd=work)
    assert str(venv) in where.stdout, where.stdout + where.stderr  # the installed copy
    version = _run([metadist, "--version"], cwd=work)
    assert version.returncode == 0 and version.stdout.startswith("metadist ")

    run_dir = work / "run"
    trained = _run(
        [
            metadist,
            "train",
            "experiment=sinusoid_maml",
            f"run_dir={run_dir}",
            "trainer.meta_steps=3",
            "trainer.meta_batch_size=4",
            "trainer.checkpoint_every=3",
            "eval.max_tasks=6",
            "eval.scratch_steps=0",
        ],
        cwd=work,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "| meta-trained + adapted |" in trained.stdout
    evaluated = _run([metadist, "eval", f"run_dir={run_dir}"], cwd=work)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert metrics["num_tasks"] == 6  # the recorded settings, not the shipped defaults
    assert not (work / "experiments").exists()

    demo = _run(
        [
            metadist,
            "demo",
            "--out",
            work / "demo",
            "--entities",
            "40",
            "--length-range",
            "120",
            "160",
            "--meta-steps",
            "4",
            "--nproc",
            "2",
        ],
        cwd=work,
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-3000:]
    assert "Traceback" not in demo.stderr
    assert (work / "demo" / "run" / "eval" / "metrics.json").is_file()
