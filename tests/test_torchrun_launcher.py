"""`python -m metadist.launch.torchrun`: torchrun whose stops read as one line each, and
whose ranks that only lost a peer (gloo tracebacks) are one line too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metadist.launch.local_ranks import OWNER_ENV

ROOT = Path(__file__).resolve().parents[1]


def _launch(script: Path, *args: str, flags: list[str] = (), **kwargs) -> subprocess.Popen:
    """torchrun on `script`, its temporary directory `_temporary(script)`."""
    command = [sys.executable, "-m", "metadist.launch.torchrun", "--standalone"]
    command += ["--nproc_per_node=2", *flags, str(script), *args]
    _temporary(script).mkdir()
    env = dict(kwargs.pop("env", os.environ), TMPDIR=str(_temporary(script)))
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        **kwargs,
    )  # fmt: skip


def _temporary(script: Path) -> Path:
    return script.parent / "tmp"


def _left_behind(script: Path) -> list[str]:
    """What the launcher left in its temporary directory (torchrun's log directory, with
    the workers' error files, was one `torchelastic_*` tree a run)."""
    return sorted(path.name for path in _temporary(script).iterdir())


@pytest.mark.timeout(120)
def test_a_failed_rank_is_named_in_one_line(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    process = _launch(script)
    out, err = process.communicate(timeout=100)
    assert process.returncode == 1, err
    assert "torchrun: the process of rank 1 exited with status 3" in err
    assert "Traceback" not in err and "ChildFailedError" not in err, err
    assert "failed (exitcode" not in err, err  # torchrun's own error log: the line says it
    assert _left_behind(script) == []


@pytest.mark.slow  # it waits for torchrun's rendezvous to be up; `make test-slow` runs it
@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_in_the_rendezvous_is_one_line(tmp_path, signum):
    """A Ctrl-C reaches torchrun while it waits in the rendezvous (here for a second
    node that never comes), before its own handlers: it was a KeyboardInterrupt
    traceback of torchrun's frames. A SIGTERM there (a Slurm job cancelled while its
    nodes meet) ended the launcher at once: nothing said, its log directory left in
    the temporary directory."""
    import socket

    script = tmp_path / "wait.py"
    script.write_text("import time\ntime.sleep(100)\n")
    _temporary(script).mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(_temporary(script)))
    env.pop(OWNER_ENV, None)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "metadist.launch.torchrun", "--nnodes=2",
               "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               "--rdzv-id=ctrl-c", str(script)]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while True:  # the rendezvous is up once its store listens on the port
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "torchrun never reached its rendezvous"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    time.sleep(1.0)  # and waiting in it for the second node
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, err
    lines = err.strip().splitlines()
    name = signal.Signals(signum).name
    assert lines == [f"torchrun: stopped by {name} before its worker processes started"], err
    assert _left_behind(script) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("owned", [False, True])
def test_sigterm_stops_the_ranks_then_says_so(tmp_path, owned):
    script = tmp_path / "wait.py"
    ready = tmp_path / "ready"
    script.write_text(
        "import os, signal, sys, time\n"
        "def stop(*_):\n"
        f"    open({str(tmp_path / 'stopped')!r} + os.environ['RANK'], 'w').close()\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({str(ready)!r} + os.environ['RANK'], 'w').close()\n"
        "time.sleep(100)\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")  # else torchrun's notice that it sets it
    env.pop(OWNER_ENV, None)
    if owned:  # started by `metadist train --nproc-per-node`, which says it itself
        env[OWNER_ENV] = "metadist train"
    process = _launch(script, env=env)
    deadline = time.monotonic() + 90
    while not all((tmp_path / f"ready{rank}").exists() for rank in (0, 1)):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    # the ranks ran their SIGTERM handlers before torchrun ended
    assert (tmp_path / "stopped0").exists() and (tmp_path / "stopped1").exists(), out + err
    # nothing else: torchrun's warnings of the signal passed on to each worker are left out
    said = (
        [] if owned else ["torchrun: stopped by SIGTERM; its worker processes were stopped first"]
    )
    assert err.strip().splitlines() == said, err
    assert _left_behind(script) == []


# A 2-rank gloo job whose rank 1 fails at step 50 (how: argv[1]) while rank 0 is in
# all_reduce; under torchrun restarts, each attempt has its own store prefix (as
# metadist.train.distributed does) and only the first attempt fails.
GLOO_JOB = """
import os, signal, sys, torch, torch.distributed as dist
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=size))
store = dist.PrefixStore(f"attempt_{attempt}", store)
dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
sys.stderr.write(f"rank {rank}: 10%\\r20%\\r")  # progress, no newline
sys.stderr.write(f"[rank{rank}] starts: not a report\\n")
sys.stderr.flush()
t = torch.ones(4)
for step in range(100 if attempt != "0" else 10**6):
    if rank == 1 and attempt == "0" and step == 50:
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        dist.destroy_process_group()  # else gloo's threads abort the exit
        raise ValueError("bad value at step 50")
    dist.all_reduce(t)
    t.fill_(1)
dist.destroy_process_group()
print(f"rank {rank} done", file=sys.stderr)
"""


def _run_gloo_job(tmp_path: Path, how: str, *flags: str) -> tuple[int, str]:
    script = tmp_path / "job.py"
    script.write_text(GLOO_JOB)
    # a slow monitor: the surviving rank surely reports its lost peer before torchrun
    # stops it (with the default 0.1 s it is a race, and the report may never come)
    process = _launch(script, how, flags=["--monitor-interval=2", *flags])
    _, err = process.communicate(timeout=100)
    assert _left_behind(script) == [], err
    return process.returncode, err


@pytest.mark.timeout(120)
def test_a_rank_killed_mid_collective_is_named_and_the_survivors_traceback_collapsed(tmp_path):
    returncode, err = _run_gloo_job(tmp_path, "kill")
    assert returncode == 1, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(
        "torchrun: the process of rank 1 was killed by SIGKILL; the others were "
        "stopped (rank 0 had lost it: RuntimeError: "
    ), err
    assert "peer" in line and "traceback left out" in line
    assert "Traceback" not in err and "[rank0]:" not in err, err
    # the ranks' other output passed through (text mode reads \r as \n)
    for rank in (0, 1):
        assert f"rank {rank}: 10%\n20%\n" in err and f"[rank{rank}] starts: not a report\n" in err


@pytest.mark.timeout(120)
def test_a_failing_rank_keeps_its_traceback_and_its_lost_peer_is_one_line(tmp_path):
    returncode, err = _run_gloo_job(tmp_path, "raise")
    assert returncode == 1, err
    assert "[rank1]: Traceback (most recent call last):" in err, err
    assert "[rank1]: ValueError: bad value at step 50" in err
    assert "[rank0]:" not in err, err  # rank 0's gloo traceback: folded into the line
    line = err.strip().splitlines()[-1]
    # "exited with status 1", or "failed" where torchrun's SIGTERM met rank 1 still
    # exiting on its error (it was named "killed by SIGTERM" then, under load)
    assert line.startswith(
        ("torchrun: the process of rank 1 exited with status 1 (its own message is above); "
         "the others were stopped",
         "torchrun: the process of rank 1 failed (its own message is above); the others "
         "were stopped")
    ), err  # fmt: skip


@pytest.mark.slow  # make test under 10 minutes; `make test-slow` runs it
@pytest.mark.timeout(180)
def test_a_restarted_job_shows_the_lost_peer_in_one_line_and_finishes(tmp_path):
    returncode, err = _run_gloo_job(tmp_path, "kill", "--max-restarts=1")
    assert returncode == 0, err
    lost = [line for line in err.splitlines() if "lost a peer" in line]
    assert len(lost) == 1, err
    assert lost[0].startswith("torchrun: the process of rank 0 lost a peer: ")
    assert lost[0].endswith("(traceback left out)")
    assert "Traceback" not in err and "[rank0]:" not in err, err
    assert "rank 0 done" in err and "rank 1 done" in err


def test_a_rank_stopped_while_it_exited_on_its_own_error_is_the_failure():
    """Under load torchrun's SIGTERM (sent once the peer that lost it failed) met rank 1
    still exiting on its own error: the line named rank 1 "killed by SIGTERM"."""
    from types import SimpleNamespace

    from metadist.launch.torchrun import _failure_line

    def failure(exitcode, timestamp):
        return SimpleNamespace(exitcode=exitcode, timestamp=timestamp,
                               signal_name=lambda: "SIGTERM")  # fmt: skip

    failures = {0: failure(1, 100), 1: failure(-signal.SIGTERM, 101)}
    held = {0: [b"[rank0]: RuntimeError: Connection closed by peer\n"]}
    line = _failure_line(failures, dict(held), {0: 100.0}, {1})
    assert line.startswith("torchrun: the process of rank 1 failed (its own message is above)")
    assert "rank 0 had lost it" in line
    # without a report of its own, a rank stopped by SIGTERM is still named so
    assert "rank 1 was killed by SIGTERM" in _failure_line(failures, dict(held), {0: 100.0})


def test_a_log_directory_named_by_the_user_is_torchruns_own(tmp_path, monkeypatch):
    from metadist.launch.torchrun import _with_log_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("PET_LOG_DIR", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    for given in (["--log-dir=/logs"], ["--log_dir", "/logs"]):
        argv = ["--standalone", *given, "-m", "metadist.train", "x=1"]
        assert _with_log_dir(argv) == (argv, None)
    # a script's own --log-dir is not torchrun's
    argv = ["--standalone", "job.py", "--log-dir=/mine"]
    changed, log_dir = _with_log_dir(argv)
    assert Path(log_dir).parent == tmp_path and Path(log_dir).is_dir()
    assert changed == [f"--log-dir={log_dir}", *argv]
    monkeypatch.setenv("PET_LOG_DIR", "/logs")
    assert _with_log_dir(["job.py"]) == (["job.py"], None)
