"""`metadist slurm submit` on a real one-node Slurm cluster (tests/slurm/cluster.sh).

A job of 2 CPU training processes (one srun task running torchrun) is requeued from
outside with `scontrol requeue`, then asked by SIGUSR1 to checkpoint and requeue itself,
and must finish with exactly the parameters of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / "tests" / "slurm" / "cluster.sh"
SLURM_DIR = Path(os.environ.get("METADIST_SLURM_DIR", "/tmp/metadist-slurm"))

# A sinusoid run with a checkpoint every 10 steps, long enough to be interrupted twice
# even on a fast machine: both interruptions come by step 40 or so, and each takes effect
# within a second (the step is cancelled at once; 600 steps, 3 s on an idle 2-core CPU,
# once finished before a requeue took effect, when it waited for KillWait).
NUM_STEPS = 1200
TRAIN_OVERRIDES = [
    "experiment=sinusoid_maml",
    f"trainer.meta_steps={NUM_STEPS}",
    "trainer.meta_batch_size=4",
    "trainer.checkpoint_every=10",
    "trainer.eval_every=0",
    "sampler.options.num_tasks=400",
    "logging.progress=false",
    "logging.log_every=10",
    "logging.wandb.mode=disabled",
]


@pytest.fixture(scope="module")
def slurm_env():
    """Environment for Slurm commands, starting the test cluster if it is installed."""
    env = dict(os.environ, SLURM_CONF=str(SLURM_DIR / "slurm.conf"))
    env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
    running = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "status"], env=env, capture_output=True, timeout=30
    )
    started = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "start", "--no-install"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if started.returncode != 0:
        pytest.skip(
            "no local Slurm cluster (install and start it as root with "
            f"`bash tests/slurm/cluster.sh start`): {started.stderr.strip()}"
        )
    yield env
    if running.returncode != 0:  # the daemons this test started are stopped with it
        subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "stop"], env=env, capture_output=True, timeout=60
        )


def _slurm(env: dict, *args: str) -> str:
    return subprocess.run(
        list(args), env=env, capture_output=True, text=True, check=True, timeout=30
    ).stdout


def _job_field(env: dict, job_id: str, name: str) -> str:
    text = _slurm(env, "scontrol", "show", "job", job_id)
    match = re.search(rf"\b{name}=(\S+)", text)
    assert match, text
    return match.group(1)


def _wait_for(predicate, what: str, timeout: float, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    detail = log.read_text() if log is not None and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n{detail}")


def _latest_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "checkpoints" / "latest").read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def _final_learner_state(run_dir: Path) -> dict[str, torch.Tensor]:
    pointer = json.loads((run_dir / "checkpoints" / "latest").read_text())
    assert pointer["step"] == NUM_STEPS, pointer
    state = torch.load(run_dir / "checkpoints" / pointer["checkpoint"], weights_only=False)
    return state["learner"]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_requeued_job_resumes_and_matches_an_uninterrupted_run(slurm_env, tmp_path):
    run_dir = tmp_path / "slurm-run"
    reference_dir = tmp_path / "reference"
    submitted = subprocess.run(
        [
            sys.executable,
            "-m",
            "metadist.cli",
            "slurm",
            "submit",
            *TRAIN_OVERRIDES,
            f"run_dir={run_dir}",
            "nodes=1",
            "gpus_per_node=0",
            "nproc_per_node=2",
            "cpus_per_task=1",
        ],
        env=slurm_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.search(r"submitted job (\d+)", submitted.stdout).group(1)
    log = run_dir / "slurm" / f"{job_id}.out"
    # The uninterrupted run: the same training under torchrun, outside Slurm.
    reference = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "metadist.train",
            *TRAIN_OVERRIDES,
            f"run_dir={reference_dir}",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # 1. Requeued from outside (what an administrator or a preemption does).
        _wait_for(lambda: _latest_step(run_dir) >= 10, "the first checkpoint", 120, log)
        _slurm(slurm_env, "scontrol", "requeue", job_id)
        _wait_for(lambda: "start 2 on" in log.read_text(), "the requeued start", 60, log)
        # 2. SIGUSR1 to the batch shell, as Slurm sends before the time limit: the script
        # has the training checkpoint, then requeues the job itself.
        resumed_at = _latest_step(run_dir)
        _wait_for(lambda: _latest_step(run_dir) > resumed_at, "a checkpoint after restart", 60, log)
        _slurm(slurm_env, "scancel", "--batch", "--signal=USR1", job_id)
        _wait_for(lambda: "start 3 on" in log.read_text(), "the self-requeued start", 60, log)
        _wait_for(
            lambda: _job_field(slurm_env, job_id, "JobState") in ("COMPLETED", "FAILED"),
            "the job to end",
            120,
            log,
        )
        assert reference.wait(timeout=120) == 0, reference.stderr.read()
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, check=False)
        if reference.poll() is None:
            reference.kill()
    text = log.read_text()
    assert _job_field(slurm_env, job_id, "JobState") == "COMPLETED", text
    assert _job_field(slurm_env, job_id, "Restarts") == "2", text
    assert "SIGUSR1 received: checkpointing, then requeueing" in text
    assert "training finished with status 0" in text
    # torchrun stopped by the requeue's SIGTERM says so in a line, not a traceback
    assert "torchrun: stopped by SIGTERM" in text and "Traceback" not in text, text
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", text)]
    assert len(resumed) == 2 and 0 < resumed[0] < resumed[1] < NUM_STEPS, text
    # The checkpoint written on SIGUSR1 is the one the third start resumed from.
    assert re.search(rf"checkpoint of step {resumed[1]} written", text), text
    state = _final_learner_state(run_dir)
    expected = _final_learner_state(reference_dir)
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name


@pytest.mark.integration
@pytest.mark.slow  # seconds on the real cluster: `make test-slow` runs it
@pytest.mark.timeout(240)
def test_a_cancel_during_the_sigusr1_stop_is_not_requeued(slurm_env, tmp_path):
    """`scancel` while a SIGUSR1 stop is under way (the time-limit warning, or one sent by
    hand) stops the job: the batch shell requeued it after the training had checkpointed,
    so a cancelled job ran again."""
    run_dir = tmp_path / "cancelled"
    submitted = subprocess.run(
        [sys.executable, "-m", "metadist.cli", "slurm", "submit", *TRAIN_OVERRIDES,
         f"run_dir={run_dir}", "gpus_per_node=0", "cpus_per_task=1"],
        env=slurm_env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.search(r"submitted job (\d+)", submitted.stdout).group(1)
    log = run_dir / "slurm" / f"{job_id}.out"
    try:
        _wait_for(lambda: _latest_step(run_dir) >= 10, "the first checkpoint", 120, log)
        _slurm(slurm_env, "scancel", "--batch", "--signal=USR1", job_id)
        _slurm(slurm_env, "scancel", job_id)
        _wait_for(
            lambda: (
                "so this script does not requeue" in log.read_text()
                or "start 2 on" in log.read_text()
            ),
            "the job to stop",
            90,
            log,
        )
        _wait_for(
            lambda: (
                _job_field(slurm_env, job_id, "JobState") != "COMPLETING"
                and "metadist: training" in log.read_text()
            ),
            "the job to end",
            60,
            log,
        )
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, check=False)
    text = log.read_text()
    assert "start 2 on" not in text, text
    assert _job_field(slurm_env, job_id, "Restarts") == "0", text
    assert _job_field(slurm_env, job_id, "JobState") == "CANCELLED", text
    assert re.search(r"checkpoint of step \d+ written", text), text


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_trials_run_as_slurm_array_elements(slurm_env, tmp_path, monkeypatch):
    from metadist.launch.sweep import ParamSpec, SweepSettings, open_study, run_sweep

    for name, value in slurm_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(REPO)
    settings = SweepSettings(
        overrides=[
            "experiment=sinusoid_maml",
            "trainer.meta_steps=12",
            "trainer.meta_batch_size=4",
            "trainer.eval_every=4",
            "trainer.eval_batches=1",
            "trainer.checkpoint_every=12",
            "learner.options.eval_inner_steps=1",
            "sampler.options.num_tasks=200",
            "logging.wandb.mode=disabled",
        ],
        space=[ParamSpec("optimizer.lr", "float", 1e-4, 1e-2, True)],
        sweep_dir=tmp_path / "sweep",
        num_trials=2,
        launcher="slurm",
        parallel=2,
        pruner="none",
        poll_seconds=0.5,
        slurm_settings=["gpus_per_node=0", "cpus_per_task=1"],
    )
    run_sweep(settings, log=lambda message: None)
    trials = open_study(settings).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    (job_id,) = {t.user_attrs["slurm_job"].split("_")[0] for t in trials}
    assert sorted(t.user_attrs["slurm_job"] for t in trials) == [f"{job_id}_0", f"{job_id}_1"]
    wave = tmp_path / "sweep" / "slurm" / "wave0000"
    assert "#SBATCH --array=0-1" in (wave / "job.sbatch").read_text()
    for index, trial in enumerate(trials):
        assert "training finished with status 0" in (wave / f"{index}.out").read_text()
        run_dir = Path(trial.user_attrs["run_dir"])
        records = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        assert [r["loss"] for r in records if r["split"] == "val"][-1] == trial.value


@pytest.mark.integration
@pytest.mark.slow  # the flag in the job script: test_slurm_script.py, in the fast suite
@pytest.mark.timeout(240)
def test_no_eval_reaches_the_jobs_training(slurm_env, tmp_path):
    """`metadist slurm submit --no-eval` was refused as an unknown argument, so a job
    always evaluated its run at the end; the flag reaches the job's training now."""
    tiny = [
        *TRAIN_OVERRIDES[:1],
        "trainer.meta_steps=4",
        "trainer.meta_batch_size=4",
        "trainer.checkpoint_every=4",
        *TRAIN_OVERRIDES[4:],
    ]
    jobs = {}
    for name, flags in (("evaluated", []), ("not-evaluated", ["--no-eval"])):
        submitted = subprocess.run(
            [sys.executable, "-m", "metadist.cli", "slurm", "submit", *tiny,
             f"run_dir={tmp_path / name}", "gpus_per_node=0", "cpus_per_task=1", *flags],
            env=slurm_env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        jobs[name] = re.search(r"submitted job (\d+)", submitted.stdout).group(1)
    try:
        for name, job_id in jobs.items():
            log = tmp_path / name / "slurm" / f"{job_id}.out"
            _wait_for(
                lambda log=log: log.exists() and "metadist: training finished" in log.read_text(),
                f"job {name} to end",
                180,
                log,
            )
    finally:
        subprocess.run(["scancel", *jobs.values()], env=slurm_env, check=False)
    for name, job_id in jobs.items():
        text = (tmp_path / name / "slurm" / f"{job_id}.out").read_text()
        assert "training finished with status 0" in text, text
        assert _latest_step(tmp_path / name) == 4, text
    assert (tmp_path / "evaluated" / "eval" / "metrics.json").is_file()
    assert not (tmp_path / "not-evaluated" / "eval").exists()
    assert "--no-eval" in (tmp_path / "not-evaluated" / "slurm" / "job.sbatch").read_text()


@pytest.mark.integration
@pytest.mark.slow  # the check: test_sweep_slurm_python.py, in the fast suite
@pytest.mark.timeout(240)
def test_a_sweeps_slurm_python_runs_its_trials(slurm_env, tmp_path, monkeypatch):
    """`--slurm python=PATH` of a sweep was dropped for the sweep's own interpreter; the
    trial's array job runs the one given (here a script of its own that runs this one)."""
    from metadist.launch.sweep import ParamSpec, SweepSettings, open_study, run_sweep

    for name, value in slurm_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(REPO)
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    venv_python.chmod(0o755)
    settings = SweepSettings(
        overrides=[
            *TRAIN_OVERRIDES[:1],
            "trainer.meta_steps=4",
            "trainer.meta_batch_size=4",
            "trainer.eval_every=2",
            "trainer.eval_batches=1",
            "trainer.checkpoint_every=4",
            "learner.options.eval_inner_steps=1",
            *TRAIN_OVERRIDES[5:],
        ],
        space=[ParamSpec("optimizer.lr", "float", 1e-4, 1e-2, True)],
        sweep_dir=tmp_path / "sweep",
        num_trials=1,
        launcher="slurm",
        pruner="none",
        poll_seconds=0.5,
        slurm_settings=["gpus_per_node=0", "cpus_per_task=1", f"python={venv_python}"],
    )
    run_sweep(settings, log=lambda message: None)
    (trial,) = open_study(settings).get_trials()
    wave = tmp_path / "sweep" / "slurm" / "wave0000"
    assert trial.state.name == "COMPLETE", (wave / "0.out").read_text()
    assert f"{venv_python} -m metadist.launch.torchrun" in (wave / "job.sbatch").read_text()
    assert "training finished with status 0" in (wave / "0.out").read_text()
