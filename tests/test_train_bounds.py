"""Absurd settings are refused in one line before anything is allocated, and one run
directory has one writer."""

import os
import resource
import subprocess
import sys

import pytest
from torch import nn

from metadist.runlock import RunLock
from metadist.train import build
from metadist.train.compose import load_config
from metadist.train.distributed import DistEnv
from metadist.train.loop import train

pytestmark = pytest.mark.integration


def _train_cli(run_dir, *overrides, timeout=120):
    command = [
        sys.executable,
        "-m",
        "metadist.cli",
        "train",
        "--no-eval",
        "experiment=sinusoid_maml",
        f"run_dir={run_dir}",
        "trainer.meta_steps=2",
        "trainer.meta_batch_size=2",
        *overrides,
    ]
    env = dict(os.environ, WANDB_MODE="disabled")
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "override,names",
    [
        ("trainer.num_threads=100000", "trainer.num_threads must be <= 1,024"),
        ("trainer.meta_steps=100000000000000000000", "trainer.meta_steps must be <="),
        ("data.block_bytes=100000000000000000000000", "data.block_bytes must be <="),
        ("learner.options.inner_steps=1000000000", "learner.options.inner_steps"),
        ("learner.options.first_order=true", None),  # a sane run, for contrast
    ],
)
def test_absurd_values_are_one_line(tmp_path, override, names):
    overrides = [override]
    if names is None:
        overrides.append("learner.options.inner_steps=1000000")
        names = "inner_steps must be <= 10,000"
    done = _train_cli(tmp_path / "run", *overrides)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert names in lines[0]


@pytest.mark.timeout(120)
def test_a_model_larger_than_memory_is_refused_without_allocating_it(tmp_path):
    # The child may not grow past 2 GB: a model of 4 TB built for real would fail
    # differently (MemoryError / killed), not with the estimate's line.
    limit = 2 * 2**30

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (8 * limit, 8 * limit))

    command = [
        sys.executable,
        "-m",
        "metadist.cli",
        "train",
        "--no-eval",
        "experiment=sinusoid_maml",
        f"run_dir={tmp_path / 'run'}",
        "model.options.hidden_sizes=[100000,100000,100000]",
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=100,
        preexec_fn=cap,
        env=dict(os.environ, WANDB_MODE="disabled"),
    )
    assert done.returncode == 1
    assert "this run needs at least" in done.stderr and "GiB is available" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(120)
def test_a_second_training_in_a_held_run_directory_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from metadist.runlock import RunLock\n"
            f"with RunLock({str(run_dir)!r}):\n    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        done = _train_cli(run_dir)
        assert done.returncode == 1
        assert f"process {holder.pid} on host" in done.stderr and "Traceback" not in done.stderr
        assert not (run_dir / "checkpoints").exists()  # nothing written by the refused run
    finally:
        holder.kill()
        holder.wait()
    # once the holder is gone (killed: its lock released by the OS) the run trains
    config = load_config(
        [
            "experiment=sinusoid_maml",
            f"run_dir={run_dir}",
            "trainer.meta_steps=2",
            "trainer.meta_batch_size=2",
        ]
    )
    assert train(config).step == 2
    with RunLock(run_dir):  # and the finished training released its lock
        pass


@pytest.mark.parametrize("learner,refused", [("reptile", False), ("maml", True)])
def test_the_memory_estimate_keeps_one_copy_for_first_order_learners(monkeypatch, learner, refused):
    # Reptile is first order by default: its memory does not grow with inner steps,
    # while second-order MAML keeps every adapted copy (4 M parameters x 5,000 steps).
    monkeypatch.setattr(build, "available_memory", lambda: 8 * 2**30)
    config = load_config(
        ["experiment=sinusoid_maml", f"learner={learner}", "learner.options.inner_steps=5000"]
    )
    check = lambda: build.check_run_memory(config, DistEnv(), lambda: nn.Linear(2000, 2000))  # noqa: E731
    if refused:
        with pytest.raises(ValueError, match="needs at least"):
            check()
    else:
        check()
