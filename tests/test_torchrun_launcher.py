"""`python -m metadist.launch.torchrun`: torchrun whose stops read as one line each."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _launch(script: Path, *args: str, **kwargs) -> subprocess.Popen:
    command = [sys.executable, "-m", "metadist.launch.torchrun", "--standalone"]
    command += ["--nproc_per_node=2", str(script), *args]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


@pytest.mark.timeout(120)
def test_a_failed_rank_is_named_in_one_line(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    process = _launch(script)
    out, err = process.communicate(timeout=100)
    assert process.returncode == 1, err
    assert "torchrun: the training process of rank 1 exited with status 3" in err
    assert "Traceback" not in err and "ChildFailedError" not in err, err


@pytest.mark.timeout(120)
def test_sigterm_stops_the_ranks_then_says_so(tmp_path):
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
    process = _launch(script)
    deadline = time.monotonic() + 90
    while not all((tmp_path / f"ready{rank}").exists() for rank in (0, 1)):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    # the ranks ran their SIGTERM handlers before torchrun ended
    assert (tmp_path / "stopped0").exists() and (tmp_path / "stopped1").exists(), out + err
    assert "torchrun: stopped by SIGTERM; its training processes were stopped first" in err
    assert "Traceback" not in err, err
