"""`python -m metadist.launch.rank_entry MODULE ARGS`: the ranks of a local launch run
`python -m MODULE ARGS`, and a Ctrl-C that reaches one while it loads ends it without a
traceback (the launching command says what it stopped)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

# a rank's module that Ctrl-C reaches while it is imported (torch takes seconds there)
INTERRUPTED_WHILE_LOADING = "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n"
ECHO = "import sys\nprint(sys.argv)\nsys.exit(3)\n"


def _sigint_default() -> None:
    """In the child: SIGINT at its default (ignored where the tests run in the background)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _rank(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "metadist.launch.rank_entry", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_sigint_default,
    )


@pytest.mark.timeout(60)
def test_a_ctrl_c_while_a_rank_loads_ends_it_quietly(tmp_path):
    (tmp_path / "loading_rank_for_test.py").write_text(INTERRUPTED_WHILE_LOADING)
    done = _rank(tmp_path, "loading_rank_for_test", "experiment=x")
    assert done.stderr == ""  # no KeyboardInterrupt traceback
    assert done.returncode == 128 + signal.SIGINT


@pytest.mark.timeout(60)
def test_a_rank_runs_its_module_as_python_m_would(tmp_path):
    (tmp_path / "echo_rank_for_test.py").write_text(ECHO)
    done = _rank(tmp_path, "echo_rank_for_test", "experiment=x", "--no-eval")
    assert done.returncode == 3
    argv = eval(done.stdout)  # noqa: S307 - the list the module printed
    assert argv[1:] == ["experiment=x", "--no-eval"]
    assert argv[0].endswith("echo_rank_for_test.py")
