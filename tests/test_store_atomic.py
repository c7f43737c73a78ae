"""Atomicity of `ingest`: a process killed with SIGKILL at any point leaves no store at
OUT, an earlier store at OUT exactly as it was, and no worker behind; one stopped by
SIGTERM or SIGHUP also removes its temporary directory, and the command says so in one
line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from store_panel import make_panel, write_files

from metadist.store import SeriesStore, ingest
from metadist.store.format import METADATA_FILE, VALUES_FILE, file_checksum
from metadist.store.verify import verify

OPTIONS = dict(entity_col="entity", time_col="t", features=["a", "b"], targets=["y"])

CHILD = """
import sys
from metadist.store import ingest
ingest(sys.argv[1], sys.argv[2], entity_col="entity", time_col="t", features=["a", "b"],
       targets=["y"], stratum_col="kind", scaling="per-entity", batch_size=64, workers=3,
       progress=False)
"""

# the same ingest through the command line
CLI_CHILD = """
import sys
from metadist.cli import main
sys.exit(main(["ingest", sys.argv[1], sys.argv[2], "--entity-col", "entity", "--time-col", "t",
               "--features", "a,b", "--targets", "y", "--stratum-col", "kind",
               "--scaling", "per-entity", "--batch-size", "64", "--workers", "3",
               "--no-progress"]))
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    panel = make_panel(seed=11, num_entities=300, length_range=(150, 350))
    return write_files(panel, tmp_path_factory.mktemp("kill-src"), num_files=3)


def _kill_during(
    source: Path, out: Path, phase: str, signum: int = signal.SIGKILL, code: str = CHILD
) -> subprocess.Popen:
    """Starts an ingest (`code`) into `out` in a child process and sends it `signum`
    during `phase`: "scan" (temporary directory made, no values yet) or "write"
    (values.bin exists). Returns the child, ended (its stderr read into `.errors`)."""
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(source), str(out)],
        stderr=subprocess.PIPE,
        text=True,
        # a test run started under nohup (or by a runner ignoring SIGHUP) passes SIG_IGN on,
        # and ingest leaves a handler it did not set alone: the child starts with defaults
        preexec_fn=_default_stop_handlers,
    )
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            temps = list(out.parent.glob(f".{out.name}.ingest-*"))
            if temps and (phase == "scan" or (temps[0] / VALUES_FILE).exists()):
                break
            assert child.poll() is None, "ingest finished before it could be killed"
            time.sleep(0.002)
        else:
            pytest.fail(f"ingest never reached the {phase} phase")
        descendants = _descendants(child.pid)
        os.kill(child.pid, signum)
    finally:
        child.errors = child.communicate(timeout=30)[1]  # type: ignore[attr-defined]
    time.sleep(0.2)
    assert [pid for pid in descendants if Path(f"/proc/{pid}").exists()] == []
    return child


def _default_stop_handlers() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def _descendants(pid: int) -> list[int]:
    """Processes started by `pid` and their own, from /proc (Linux)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            found += [int(c) for c in children]
            todo += [int(c) for c in children]
    return found


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("phase", ["scan", "write"])
def test_sigkill_leaves_no_store(tmp_path, source, phase):
    out = tmp_path / "store"
    assert _kill_during(source, out, phase).returncode == -signal.SIGKILL
    assert not out.exists()
    # The next ingest into the same OUT removes the dead process's temporary directory.
    ingest(source, out, progress=False, **OPTIONS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    verify(out)


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("phase", ["scan", "write"])
def test_sigkill_keeps_existing_store_intact(tmp_path, source, phase):
    out = tmp_path / "store"
    before = ingest(source, out, scaling="global", progress=False, **OPTIONS)
    values_before = np.array(before.values)
    metadata_before = (out / METADATA_FILE).read_bytes()
    checksum_before = file_checksum(out / VALUES_FILE)
    del before
    assert _kill_during(source, out, phase).returncode == -signal.SIGKILL
    assert (out / METADATA_FILE).read_bytes() == metadata_before
    assert file_checksum(out / VALUES_FILE) == checksum_before
    after = verify(out)
    np.testing.assert_array_equal(np.asarray(after.values), values_before)
    assert SeriesStore.open(out).metadata["scaling"]["kind"] == "global"


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_removes_the_temporary_directory(tmp_path, source, signum):
    """`ingest()` stopped by SIGTERM or SIGHUP ends with the status a shell reports for
    the signal, leaves no store and no temporary directory beside OUT."""
    out = tmp_path / "store"
    child = _kill_during(source, out, "write", signum)
    assert child.returncode == 128 + signum, child.errors[-2000:]
    assert "Traceback" not in child.errors, child.errors[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_sigterm_to_the_command_says_so_and_keeps_the_store(tmp_path, source):
    """`metadist ingest` stopped by SIGTERM over an existing store: one line naming the
    signal and OUT, the old store as it was, nothing else beside it."""
    out = tmp_path / "store"
    ingest(source, out, scaling="global", progress=False, **OPTIONS)
    metadata_before = (out / METADATA_FILE).read_bytes()
    child = _kill_during(source, out, "write", signal.SIGTERM, CLI_CHILD)
    assert child.returncode == 128 + signal.SIGTERM, child.errors[-2000:]
    lines = child.errors.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("metadist ingest: stopped by SIGTERM"), lines
    assert str(out) in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    assert (out / METADATA_FILE).read_bytes() == metadata_before
    verify(out)


# the same command, sent SIGTERM by itself as the new store is put in place
PUBLISH_STOPPED_CHILD = (
    """
import importlib, os, signal
ingest_module = importlib.import_module("metadist.store.ingest")  # the module, not the function
real_publish = ingest_module.publish

def publish(temp, out):
    real_publish(temp, out)
    os.kill(os.getpid(), signal.SIGTERM)

ingest_module.publish = publish
"""
    + CLI_CHILD
)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_sigterm_as_the_store_is_put_in_place_says_the_new_store_is_there(tmp_path, source):
    """A stop that lands once the new store has replaced the old one was reported as 'no
    store was written (what was there is unchanged)' over the new store: it is held until
    the store is in place, and the line says the new store is there, complete."""
    out = tmp_path / "store"
    ingest(source, out, scaling="global", progress=False, **OPTIONS)
    child = subprocess.run(
        [sys.executable, "-c", PUBLISH_STOPPED_CHILD, str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=150,
        preexec_fn=_default_stop_handlers,
    )
    assert child.returncode == 128 + signal.SIGTERM, child.stderr[-2000:]
    lines = child.stderr.strip().splitlines()
    assert lines == [
        f"metadist ingest: stopped by SIGTERM as the store at {out} was put in place: the new "
        "store is there, complete"
    ], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    verify(out)
    assert SeriesStore.open(out).metadata["scaling"]["kind"] == "per-entity"
