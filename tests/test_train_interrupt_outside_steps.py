"""A first Ctrl-C outside the meta-steps (the command loading, the run being built): one
line that says what happened, never a traceback, and never "a second Ctrl-C"."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from metadist import cli

# imported by the run (`imports=[...]`) while it is built: Ctrl-C arrives then
INTERRUPTING = "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n"


def _sigint_default() -> None:
    """In the child: SIGINT at its default (ignored where the tests run in the background),
    so that Python raises KeyboardInterrupt on it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(120)
def test_ctrl_c_while_the_run_is_built_is_one_line_and_writes_no_checkpoint(tmp_path):
    (tmp_path / "interrupting_for_test.py").write_text(INTERRUPTING)
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "metadist.cli",
        "train",
        "experiment=sinusoid_maml",
        "imports=[interrupting_for_test]",
        "trainer.meta_steps=3",
        "logging.wandb.mode=disabled",
        f"run_dir={run_dir}",
        "--no-eval",
    ]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_sigint_default,
    )
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "second Ctrl-C" not in lines[0]  # there was only one
    assert lines[0].startswith("metadist train: interrupted before the meta-steps began")
    assert not (run_dir / "checkpoints").exists()


def test_ctrl_c_while_the_command_loads_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "interrupting_command_for_test.py").write_text(INTERRUPTING)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "train", "interrupting_command_for_test")
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        status = cli.main(["train", "experiment=sinusoid_maml"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C while the command loads escaped main (a traceback)")
    finally:
        signal.signal(signal.SIGINT, before)
        sys.modules.pop("interrupting_command_for_test", None)
    assert status == 130
    assert capsys.readouterr().err == "metadist train: interrupted\n"
