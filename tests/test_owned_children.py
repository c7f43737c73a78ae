"""A stop signal reaches every process a command started, even those in new sessions."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from metadist.launch.children import alive, descendants

pytestmark = pytest.mark.integration

# The command: starts a child that starts a grandchild in a session of its own (as
# torchrun starts its ranks) and ignores SIGTERM (a rank busy in a collective).
COMMAND = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from metadist.launch.children import OwnedChildren, StopRequested
    CHILD = '''
    import signal, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
        start_new_session=True)
    print(grandchild.pid, flush=True)
    time.sleep(600)
    '''
    try:
        with OwnedChildren("demo-command", grace_s=1.0) as children:
            child = children.popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
            grandchild = int(child.stdout.readline())
            with open(sys.argv[1], "w") as out:
                json.dump({"child": child.pid, "grandchild": grandchild}, out)
            child.wait()
    except StopRequested as stop:
        print(f"demo-command: {stop.summary}", file=sys.stderr)
        sys.exit(stop.exit_status)
    """
)


def _wait_for(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return json.loads(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_stops_children_and_their_sessions(tmp_path, signum):
    pids_file = tmp_path / "pids.json"
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND, str(pids_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = _wait_for(pids_file)
        assert set(pids.values()) <= set(descendants(command.pid))
        command.send_signal(signum)
        out, err = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode == 128 + signum
    name = signal.Signals(signum).name
    assert err.strip().splitlines() == [
        f"demo-command: stopped by {name}; 2 processes it started stopped"
    ]
    for pid in pids.values():
        assert not alive(pid), f"process {pid} outlived the command"


POOL_COMMAND = textwrap.dedent(
    """
    import json, multiprocessing, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from metadist.launch.children import OwnedChildren, StopRequested
    try:
        with OwnedChildren("demo-command", grace_s=5.0):
            pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
            try:  # as an evaluation closes its pool: the running tasks are waited for
                futures = [pool.submit(time.sleep, 600) for _ in range(6)]
                time.sleep(1.0)
                with open(sys.argv[1], "w") as out:
                    json.dump({"workers": [p.pid for p in pool._processes.values()]}, out)
                futures[0].result()
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    except StopRequested as stop:
        print(f"demo-command: {stop.summary}", file=sys.stderr)
        sys.exit(stop.exit_status)
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("group", [True, False])
def test_a_stop_ends_a_forked_worker_pool_quietly_and_counts_it(tmp_path, group):
    """An evaluation's worker pool (forked, so it inherits the command's stop handler):
    a Ctrl-C to the group printed a StopRequested traceback from each worker, and the
    stop line said "0 processes it started stopped"."""
    record = tmp_path / "pool.json"
    command = subprocess.Popen(
        [sys.executable, "-c", POOL_COMMAND, str(record)], stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        workers = _wait_for(record)["workers"]
        if group:
            os.killpg(command.pid, signal.SIGINT)  # a terminal's Ctrl-C
        else:
            command.send_signal(signal.SIGINT)
        _, err = command.communicate(timeout=60)
    finally:  # never leave a worker behind, even on failure: the session is theirs
        with contextlib.suppress(ProcessLookupError):
            os.killpg(command.pid, signal.SIGKILL)
        command.wait()
    assert command.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == [
        "demo-command: stopped by SIGINT; 2 processes it started stopped"
    ], err
    assert not any(alive(pid) for pid in workers)


def test_descendants_sees_a_process_tree():
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '30'])"]
    )
    try:
        deadline = time.monotonic() + 20
        found: list[int] = []
        while time.monotonic() < deadline and len(found) < 2:
            found = descendants(os.getpid())
            found = [pid for pid in found if pid == child.pid or pid in descendants(child.pid)]
            time.sleep(0.05)
        assert child.pid in found and len(found) == 2
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()


def _training(run_dir: Path) -> bool:
    """Whether the run has logged a meta-step: its ranks are in the training loop, their
    stop handlers set (`metrics.jsonl` exists from before that, while DDP still starts)."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and metrics.stat().st_size > 0


@pytest.mark.slow  # make test under 10 minutes; `make test-slow` runs it
@pytest.mark.timeout(240)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_of_a_multi_process_train_stops_torchrun_and_every_rank(tmp_path, signum):
    """SIGTERM to the command (as Slurm or `kill` sends it) and SIGINT to its whole
    process group (as Ctrl-C at a terminal sends it): every process stops, and stderr
    says so in two lines, the checkpoint written and the command's own."""
    command = [
        sys.executable,
        "-m",
        "metadist.cli",
        "train",
        "--nproc-per-node=2",
        "--no-eval",
        "experiment=sinusoid_maml",
        f"run_dir={tmp_path / 'run'}",
        "trainer.meta_steps=1000000",
        "trainer.meta_batch_size=4",
        "trainer.checkpoint_every=1000000",
    ]
    env = dict(os.environ, WANDB_MODE="disabled")
    train = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # its own process group, as at a terminal
    )  # fmt: skip
    try:
        below: set[int] = set()
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not _training(tmp_path / "run"):
            below |= set(descendants(train.pid))
            time.sleep(0.2)
        below |= set(descendants(train.pid))
        assert len(below) >= 3, "torchrun and two ranks never ran"  # launcher + 2 ranks
        if signum == signal.SIGINT:
            os.killpg(train.pid, signum)  # the terminal's Ctrl-C reaches every process
        else:
            train.send_signal(signum)
        out, err = train.communicate(timeout=120)
    finally:
        leftover = descendants(train.pid)  # never leave a training behind, even on failure
        if train.poll() is None:
            train.kill()
        for pid in leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    name = signal.Signals(signum).name
    assert train.returncode == 128 + signum, err[-2000:]
    lines = err.strip().splitlines()[1:]  # after the run's header
    assert len(lines) == 2, err[-3000:]  # not torchrun's warnings, nor the stop said thrice
    assert lines[0].startswith(f"{name}: checkpoint of step "), err[-3000:]
    assert lines[1].startswith(f"metadist train: stopped by {name}; "), err[-3000:]
    for pid in below:
        assert not alive(pid), f"process {pid} outlived metadist train"


@pytest.mark.slow  # make test under 10 minutes; `make test-slow` runs it
@pytest.mark.timeout(240)
def test_a_stop_of_the_launcher_alone_is_said_by_the_command(tmp_path):
    """SIGTERM to the torchrun launcher under `metadist train --nproc-per-node 2` (not to
    the command): the ranks checkpoint and the command says the launcher was stopped
    (it said nothing: the launcher left it to the command, which was never signalled)."""
    command = [sys.executable, "-m", "metadist.cli", "train", "--nproc-per-node=2", "--no-eval",
               "experiment=sinusoid_maml", f"run_dir={tmp_path / 'run'}",
               "trainer.meta_steps=1000000", "trainer.meta_batch_size=4",
               "trainer.checkpoint_every=1000000"]  # fmt: skip
    env = dict(os.environ, WANDB_MODE="disabled")
    train = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not _training(tmp_path / "run"):
            time.sleep(0.2)
        launcher = [
            pid for pid in descendants(train.pid)
            if b"metadist.launch.torchrun" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]  # fmt: skip
        assert launcher, "torchrun never ran"
        os.kill(launcher[0], signal.SIGTERM)
        _, err = train.communicate(timeout=120)
    finally:
        leftover = descendants(train.pid)
        if train.poll() is None:
            train.kill()
        for pid in leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert train.returncode == 128 + signal.SIGTERM, err[-2000:]
    lines = err.strip().splitlines()
    assert (
        lines[-1]
        == "metadist train: its launcher (torchrun) was stopped by SIGTERM; run the same command again to resume"
    ), err[-2000:]
