"""`metadist synth` stopped by SIGTERM or SIGHUP: the panel's hidden directory is removed,
an earlier panel is kept, and the command says so in one line; off a terminal a long
generation prints a progress line now and then."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

import metadist.progress
from metadist.datasets.synthetic import write_synthetic_panel


def _stopped_midway(tmp_path, signum: int) -> tuple[int, str]:
    """Runs `metadist synth` over an earlier panel, sends `signum` once a file of the new
    one has rows, and returns (status, stderr)."""
    out_dir = tmp_path / "panel"
    process = subprocess.Popen(
        [sys.executable, "-m", "metadist.cli", "synth", str(out_dir), "--entities", "20000",
         "--length-range", "800", "1000", "--chunk-rows", "20000", "--overwrite"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 100
        written: list = []
        while time.monotonic() < deadline and process.poll() is None:
            written = [p for p in tmp_path.glob(".panel.partial-*/*.parquet") if p.stat().st_size]
            if written:
                break
            time.sleep(0.05)
        assert written and process.poll() is None, "generation did not start or ended too soon"
        process.send_signal(signum)
        _, errors = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, errors


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_removes_the_hidden_directory_and_says_so(tmp_path, signum):
    earlier = write_synthetic_panel(tmp_path / "panel", num_entities=4, length_range=(20, 30))
    before = {path.name: path.read_bytes() for path in earlier.files}
    status, errors = _stopped_midway(tmp_path, signum)
    assert status == 128 + signum, errors[-2000:]
    lines = errors.strip().splitlines()
    name = signal.Signals(signum).name
    assert len(lines) == 1 and lines[0].startswith(f"metadist synth: stopped by {name}"), lines
    assert str(tmp_path / "panel") in lines[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["panel"]
    assert {path.name: path.read_bytes() for path in (tmp_path / "panel").iterdir()} == before


def test_off_a_terminal_a_large_panel_prints_progress_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(metadist.progress, "LINE_EVERY_S", 0.0)  # a line at every chunk
    write_synthetic_panel(
        tmp_path / "panel", num_entities=2000, length_range=(1000, 1100), chunk_rows=500_000
    )
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("synth")]
    assert lines and all("rows" in line for line in lines), lines


def test_off_a_terminal_a_small_panel_prints_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(metadist.progress, "LINE_EVERY_S", 0.0)
    write_synthetic_panel(tmp_path / "panel", num_entities=5, length_range=(20, 30))
    assert capsys.readouterr().err == ""
