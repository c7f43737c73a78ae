"""One writer per run directory: a second writer is refused naming the holder's pid and
host; the lock of a killed holder is taken over (real processes, with timeouts)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys

import pytest

from metadist.runlock import LOCK_FILE, RunLock, RunLockedError, read_holder

HOLD = """
import sys, time
from metadist.runlock import RunLock
with RunLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""
TAKE = """
import sys
from metadist.runlock import RunLock, read_holder
try:
    with RunLock(sys.argv[1]):
        print("took it", read_holder(sys.argv[1])["pid"], flush=True)
except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
"""


def _holder(run_dir) -> subprocess.Popen:
    """A process holding `run_dir`'s lock (it has said so on stdout)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    ready, _, _ = select.select([process.stdout], [], [], 60)
    assert ready and process.stdout.readline().strip() == "held"
    return process


def _take(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", TAKE, str(run_dir)], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def holders():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait(timeout=30)


def test_a_second_writer_is_refused_naming_the_holders_pid_and_host(tmp_path, holders):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    holders.append(holder)
    done = _take(run_dir)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"process {holder.pid} on host {socket.gethostname()}" in lines[0], lines[0]
    assert f"{run_dir} is in use by another writer" in lines[0], lines[0]
    assert read_holder(run_dir)["pid"] == holder.pid  # the refused writer changed nothing


def test_the_lock_of_a_killed_holder_is_taken_over(tmp_path, holders):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    holders.append(holder)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    assert read_holder(run_dir)["pid"] == holder.pid  # a stale lock file stays behind
    done = _take(run_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("took it") and _pid_of(done) != holder.pid
    assert not (run_dir / LOCK_FILE).exists()  # released and removed on exit


def _pid_of(done: subprocess.CompletedProcess) -> int:
    return int(done.stdout.split()[-1])


def test_a_finished_holder_leaves_the_run_dir_free(tmp_path):
    run_dir = tmp_path / "run"
    with RunLock(run_dir) as lock:
        assert lock.held and read_holder(run_dir) == {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": read_holder(run_dir)["since"],
        }
        with pytest.raises(RunLockedError, match=f"process {os.getpid()} on host"):
            RunLock(run_dir).acquire()  # a second lock, even in the same process
    assert not lock.held and not (run_dir / LOCK_FILE).exists()
    with pytest.raises(KeyError), RunLock(run_dir):
        raise KeyError("the block failed")
    assert _take(run_dir).returncode == 0  # released on the error too


def test_a_stale_lock_file_of_any_content_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere"}) + "garbage")
    with RunLock(run_dir):
        assert read_holder(run_dir)["pid"] == os.getpid()


def test_what_is_in_the_way_of_the_lock_is_one_line(tmp_path):
    (tmp_path / "file").write_text("a file")
    with pytest.raises(ValueError, match="file is not a directory: it must be the run"):
        RunLock(tmp_path / "file").acquire()
    (tmp_path / "run" / LOCK_FILE).mkdir(parents=True)
    with pytest.raises(ValueError, match=r"\.lock: is a directory"):
        RunLock(tmp_path / "run").acquire()
    assert (tmp_path / "file").read_text() == "a file"
