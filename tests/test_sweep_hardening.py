"""Sweeps that survive their driver: trials die with it, a restart re-runs them once from
their checkpoint, the sampler does not replay itself, and a bad study or space file is
refused with one line before anything is created."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from metadist.cli import main as cli_main
from metadist.launch.sweep import ParamSpec, SweepSettings, open_study

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "experiment=sinusoid_maml",
    "trainer.meta_batch_size=4",
    "trainer.eval_batches=1",
    "trainer.checkpoint_every=100000",
    "learner.options.eval_inner_steps=1",
    "model.options.hidden_sizes=[8]",
    "sampler.options.num_tasks=200",
    "logging.wandb.mode=disabled",
]
SPACE = "optimizer.lr: {type: float, low: 1e-4, high: 1e-2, log: true}\n"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.integration
@pytest.mark.timeout(400)
@pytest.mark.slow  # two sweep drivers and a kill: ~35 s; under `make test-slow`
def test_a_killed_driver_takes_its_trial_along_and_the_restart_resumes_it(tmp_path):
    sweep_dir = tmp_path / "sweep"
    (tmp_path / "space.yaml").write_text(SPACE)
    command = [
        sys.executable,
        "-m",
        "metadist.cli",
        "sweep",
        *TINY,
        # enough steps that the kill lands while it trains (60 finished before it on an
        # idle machine)
        "trainer.meta_steps=600",
        "trainer.eval_every=10",
        "--trials=1",
        "--pruner=none",
        f"--space={tmp_path / 'space.yaml'}",
        f"--sweep-dir={sweep_dir}",
        "--poll-seconds=0.2",
    ]
    driver = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    metrics = sweep_dir / "trials" / "0000" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and '"val"' not in (
        metrics.read_text() if metrics.exists() else ""
    ):
        time.sleep(0.05)
    trainers = _children(driver.pid)
    assert len(trainers) == 1, "the trial's training process was not found"
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)

    deadline = time.monotonic() + 30
    while _running(trainers[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    still_running = _running(trainers[0])
    if still_running:
        os.kill(trainers[0], signal.SIGKILL)
    assert not still_running, "the trial outlived its driver"
    log = (sweep_dir / "trials" / "0000" / "train.log").read_text()
    assert "SIGTERM: checkpoint of step" in log, log  # it stopped, it did not finish

    continued = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert continued.returncode == 0, continued.stdout + continued.stderr
    storage = f"sqlite:///{sweep_dir}/study.db"
    cut, rerun = optuna.load_study(study_name="metadist-sweep", storage=storage).get_trials()
    assert (cut.state.name, rerun.state.name) == ("FAIL", "COMPLETE")
    assert rerun.params == cut.params and rerun.user_attrs["seed"] == cut.user_attrs["seed"]
    assert rerun.user_attrs["run_dir"] == cut.user_attrs["run_dir"]  # one run directory
    log = (sweep_dir / "trials" / "0000" / "train.log").read_text()
    assert "resumed from" in log and log.count("finished 600 meta-steps") == 1, log


def _settings(tmp_path: Path) -> SweepSettings:
    return SweepSettings(
        overrides=[*TINY, "trainer.meta_steps=4", "trainer.eval_every=2"],
        space=[ParamSpec("optimizer.lr", "float", 1e-4, 1e-2, True)],
        sweep_dir=tmp_path / "sweep",
        num_trials=4,
    )


def test_a_continued_study_does_not_replay_its_sampler(tmp_path):
    settings = _settings(tmp_path)
    settings.sweep_dir.mkdir()
    study = open_study(settings)
    first = []
    for value in (1.0, 2.0):
        trial = study.ask()
        first.append(settings.space[0].suggest(trial))
        study.tell(trial, value)
    again = open_study(settings)  # a restarted driver
    later = []
    for _ in range(2):
        trial = again.ask()
        later.append(settings.space[0].suggest(trial))
        again.tell(trial, 3.0)
    assert not set(later) & set(first), (first, later)
    # A fresh study still starts from sampler_seed: reproducible suggestions.
    other = _settings(tmp_path / "other")
    other.sweep_dir.mkdir(parents=True)
    assert settings.space[0].suggest(open_study(other).ask()) == first[0]


def _sweep_cli(tmp_path: Path, space_text: str) -> list[str]:
    (tmp_path / "space.yaml").write_text(space_text)
    return [
        "sweep",
        *TINY,
        "trainer.meta_steps=4",
        "trainer.eval_every=2",
        "--trials=1",
        f"--space={tmp_path / 'space.yaml'}",
        f"--sweep-dir={tmp_path / 'sweep'}",
        "--poll-seconds=0.2",
    ]


@pytest.mark.parametrize(
    "content",
    [b"", b"SQLite format 3\x00" + b"\x13" * 3000, b"not a database at all"],
    ids=["empty", "corrupt", "foreign"],
)
def test_an_unusable_study_db_is_refused_with_one_line(tmp_path, capsys, content):
    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "trials" / "0000").mkdir(parents=True)
    (sweep_dir / "trials" / "0000" / "marker").write_text("old trial")
    (sweep_dir / "study.db").write_bytes(content)
    assert cli_main(_sweep_cli(tmp_path, SPACE)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(sweep_dir / "study.db") in lines[0], lines
    assert (sweep_dir / "study.db").read_bytes() == content
    assert [p.name for p in (sweep_dir / "trials").iterdir()] == ["0000"]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_typo_in_the_space_leaves_nothing_and_the_corrected_command_runs(tmp_path, capsys):
    typo = "optimizer.lrr: {type: float, low: 1e-4, high: 1e-2, log: true}\n"
    assert cli_main(_sweep_cli(tmp_path, typo)) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "optimizer.lrr" in error[0], error
    assert not (tmp_path / "sweep").exists()
    assert cli_main(_sweep_cli(tmp_path, SPACE)) == 0, capsys.readouterr().err


def test_a_restart_stops_a_leftover_attempt_before_queueing_it_again(tmp_path):
    from metadist.launch.sweep.runners import process_start_time
    from metadist.launch.sweep.study import recover_interrupted

    settings = _settings(tmp_path)
    settings.sweep_dir.mkdir()
    trial = open_study(settings).ask()
    settings.space[0].suggest(trial)
    trial.set_user_attr("seed", 7)
    trial.set_user_attr("run_dir", str(tmp_path / "run"))
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    try:
        process = {"pid": leftover.pid, "start": process_start_time(leftover.pid)}
        trial.set_user_attr("process", process)
        messages: list[str] = []
        recover_interrupted(open_study(settings), messages.append)
        assert leftover.wait(timeout=10) == -signal.SIGTERM  # gone before the re-run
    finally:
        leftover.kill()
        leftover.wait()
    frozen, queued = open_study(settings).get_trials()
    assert (frozen.state.name, queued.state.name) == ("FAIL", "WAITING")
    assert queued.user_attrs == {"seed": 7, "run_dir": str(tmp_path / "run")}
    assert queued.system_attrs["fixed_params"] == frozen.params
    assert any("stopped the training left by the earlier driver" in m for m in messages)
