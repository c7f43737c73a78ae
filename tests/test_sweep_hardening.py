"""Sweeps that survive their driver: trials die with it, a restart re-runs them once from
their checkpoint, the sampler does not replay itself, and a bad study or space file is
refused with one line before anything is created."""

from __future__ import annotations

import contextlib
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


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_wave_sbatch_refuses_is_failed_trials_not_stuck_ones(tmp_path, capsys, monkeypatch):
    """sbatch refuses a Slurm sweep's wave: one line with its reason, the wave's files
    removed, its trials failed (they stayed `running`, and the next start said they had
    been interrupted)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        "#!/bin/sh\necho 'sbatch: error: no config' >&2\necho 'fatal: none' >&2\nexit 1\n"
    )
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    argv = [*_sweep_cli(tmp_path, SPACE), "--launcher=slurm", "--slurm", "nodes=1"]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "sbatch refused the job: sbatch: error: no config; fatal: none" in err[0]
    assert "(trials 0 recorded as failed)" in err[0]
    assert not (tmp_path / "sweep" / "slurm" / "wave0000").exists()
    study = open_study(
        SweepSettings(overrides=TINY, space=[], sweep_dir=tmp_path / "sweep"), create=False
    )
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.FAIL]


def test_a_directory_that_holds_no_sweep_is_refused_as_a_new_ones(tmp_path, capsys):
    """A training run's directory (or another sweep's trials/ folder) is not a place for
    a new sweep: its files would mix with the sweep's."""
    (tmp_path / "sweep" / "checkpoints").mkdir(parents=True)
    (tmp_path / "sweep" / "metrics.jsonl").write_text("")
    assert cli_main(_sweep_cli(tmp_path, SPACE)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no sweep (study.db) but other files (checkpoints" in err[0]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == [
        "checkpoints",
        "metrics.jsonl",
    ]


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("--poll-seconds=-1", "--poll-seconds must be > 0 and <= 86400, got -1.0"),
        ("--poll-seconds=inf", "--poll-seconds must be > 0 and <= 86400, got inf"),
        ("--poll-seconds=1e300", "--poll-seconds must be > 0 and <= 86400, got 1e+300"),
        ("--warmup-steps=-5", "--warmup-steps must be >= 0, got -5"),
        ("--startup-trials=-1", "--startup-trials must be >= 0, got -1"),
        ("--slurm=nodes=1", "--slurm nodes=1: Slurm settings apply to --launcher slurm"),
        # an accuracy minimised (the default direction) would make the worst trial the best
        (
            "--metric=query_accuracy_after",
            "--metric query_accuracy_after is better higher, but the sweep would minimize it "
            "(the best trial would be the worst); give --direction maximize",
        ),
        ("--direction=maximize", "--metric loss is better lower, but the sweep would maximize"),
    ],
)
def test_bad_sweep_settings_are_refused_before_anything_is_made(tmp_path, capsys, flag, said):
    assert cli_main([*_sweep_cli(tmp_path, SPACE), flag]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert not (tmp_path / "sweep").exists()


def test_a_parameter_given_twice_in_the_space_is_refused(tmp_path, capsys):
    assert cli_main(_sweep_cli(tmp_path, SPACE + SPACE)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'optimizer.lr' is given twice" in err[0], err


def test_a_pinned_split_too_long_for_a_command_line_is_refused_before_the_study(tmp_path, capsys):
    argv = [*_sweep_cli(tmp_path, SPACE), "sampler.options.num_tasks=400000"]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "too many for a command line" in err[0], err
    assert not (tmp_path / "sweep").exists()


def test_the_config_dir_is_recorded_where_it_is(tmp_path, monkeypatch):
    """A sweep made with `--config-dir mine` continues with the same directory named
    another way (absolute, or with a slash), and no other."""
    import shutil

    from metadist.configs import find_experiments_dir
    from metadist.launch.sweep.study import check_meta

    shutil.copytree(find_experiments_dir(None), tmp_path / "mine")
    monkeypatch.chdir(tmp_path)
    made = SweepSettings(overrides=TINY, space=[], sweep_dir=tmp_path / "s", config_dir="mine")
    made.validate()
    assert made.config_dir == str(tmp_path / "mine")
    study = optuna.create_study()
    check_meta(study, made)
    again = SweepSettings(overrides=TINY, space=[], sweep_dir=tmp_path / "s", config_dir="mine/")
    again.validate()
    check_meta(study, again)
    study.set_user_attr(
        "sweep", {**study.user_attrs["sweep"], "config_dir": "mine"}
    )  # an older record
    check_meta(study, again)
    with pytest.raises(FileNotFoundError, match="no experiments directory .*nowhere"):
        SweepSettings(
            overrides=TINY, space=[], sweep_dir=tmp_path / "s", config_dir="nowhere"
        ).validate()


def test_a_refused_driver_leaves_the_running_ones_lock(tmp_path):
    from metadist.launch.sweep.study import LOCK_FILE, sweep_lock

    place = tmp_path / "new"
    with sweep_lock(place), contextlib.ExitStack() as second:
        with pytest.raises(ValueError, match="another sweep is running"):
            second.enter_context(sweep_lock(place))
        assert (place / LOCK_FILE).exists()  # still the first driver's
    assert not place.exists()  # it made no study: nothing is left


def test_an_older_studys_config_dir_of_the_same_place_still_matches(tmp_path, monkeypatch):
    import shutil

    from metadist.configs import find_experiments_dir
    from metadist.launch.sweep.study import check_meta

    shutil.copytree(find_experiments_dir(None), tmp_path / "mine")
    monkeypatch.chdir(tmp_path)
    settings = SweepSettings(overrides=TINY, space=[], sweep_dir=tmp_path / "s", config_dir="mine")
    settings.validate()
    study = optuna.create_study()
    check_meta(study, settings)
    for older in (f"{tmp_path}/mine/", f"{tmp_path}/./mine", "mine"):
        study.set_user_attr("sweep", {**study.user_attrs["sweep"], "config_dir": older})
        check_meta(study, settings)


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)]
)
def test_a_driver_stopped_by_sigterm_stops_and_queues_its_trial_as_ctrl_c_does(tmp_path, signum):
    """A sweep stopped by SIGTERM (a job's time limit, `kill`) or SIGHUP (its terminal
    closed) died at once: no word, `trials.md` stale, the trial still RUNNING in the study
    until a restart. It now stops as on Ctrl-C: the trial checkpoints, exits and is queued
    again, the reports are rewritten, and one line says what stopped it."""
    sweep_dir = tmp_path / "sweep"
    argv = _sweep_cli(tmp_path, SPACE)
    argv[argv.index("trainer.meta_steps=4")] = "trainer.meta_steps=1000000"
    driver = subprocess.Popen(
        [sys.executable, "-m", "metadist.cli", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        metrics = sweep_dir / "trials" / "0000" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        # the training runs: a meta-step is logged once its stop handlers are set
        while '"val"' not in _text(metrics) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert '"val"' in _text(metrics)
        driver.send_signal(signum)
        out, err = driver.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    name = signal.Signals(signum).name
    assert driver.returncode == 128 + signum, out + err
    assert err.strip().splitlines() == [
        f"metadist sweep: stopped by {name} (run the same command again to continue the sweep)"
    ]
    assert "trial 0 stopped; it runs again when the sweep is continued" in out
    storage = f"sqlite:///{sweep_dir}/study.db"
    cut, queued = optuna.load_study(study_name="metadist-sweep", storage=storage).get_trials()
    assert (cut.state.name, queued.state.name) == ("FAIL", "WAITING")
    assert not _running(cut.user_attrs["process"]["pid"])  # the training is gone
    assert "SIGTERM: checkpoint of step" in (metrics.parent / "train.log").read_text()
    rows = (sweep_dir / "trials.md").read_text().splitlines()
    (cut_row,) = [r for r in rows if r.startswith("| 0 | fail |")]
    assert cut_row.endswith("| cut off; resumed as trial 1 |"), cut_row
    # the queued trial's row shows the parameters it will run with
    lr = f"{cut.params['optimizer.lr']:.4g}"
    assert any(r.startswith(f"| 1 | waiting | 0 | {lr} |") for r in rows), rows


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_rerun_stopped_by_sigterm_stops_its_training_and_says_so(tmp_path):
    """`--rerun` stopped by SIGTERM died without a word, its training left to the
    parent-death signal; it now stops the training (it checkpoints) and says so."""
    from metadist.launch.sweep.study import check_meta

    settings = _settings(tmp_path)
    settings.overrides = [*TINY, "trainer.meta_steps=1000000", "trainer.eval_every=2"]
    settings.sweep_dir.mkdir()
    study = open_study(settings)
    check_meta(study, settings)
    trial = study.ask()
    settings.space[0].suggest(trial)
    trial.set_user_attr("seed", 0)
    study.tell(trial, 0.5)  # a completed trial, whose rerun trains a long time
    driver = subprocess.Popen(
        [sys.executable, "-m", "metadist.cli", "sweep", f"--sweep-dir={settings.sweep_dir}"]
        + ["--rerun=0", "--poll-seconds=0.2"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        metrics = settings.sweep_dir / "reruns" / "0000-0" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while '"val"' not in _text(metrics) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert '"val"' in _text(metrics)
        driver.send_signal(signal.SIGTERM)
        out, err = driver.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 128 + signal.SIGTERM, out + err
    assert err.strip().splitlines() == ["metadist sweep: stopped by SIGTERM (the rerun of trial 0)"]
    # the training was stopped (and waited for) before the command ended
    assert "SIGTERM: checkpoint of step" in (metrics.parent / "train.log").read_text()
