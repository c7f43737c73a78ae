"""A sampler that workers started by spawn or forkserver cannot rebuild (its class under a
script's `if __name__ == "__main__":`, typed into an interactive session, or local to a
function) is refused in one line naming it before any worker starts; it was a traceback
from every worker and "DataLoader worker (pid(s) ...) exited unexpectedly"."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SAMPLER = """
class Counting(SinusoidSampler):
    pass
"""

LOADER = """
loader = BatchMetaDataLoader(
    Counting(num_tasks=12), np.arange(12), batch_size=4, num_workers=1,
    multiprocessing_context=sys.argv[1],
)
print("batches", len(list(loader)))
"""

HEAD = """
import sys

import numpy as np

from metadist.data import BatchMetaDataLoader
from metadist.tasks.sinusoid import SinusoidSampler
"""


def _indented(text: str) -> str:
    return textwrap.indent(text, "    ")


SCRIPTS = {
    "guarded": HEAD + 'if __name__ == "__main__":\n' + _indented(SAMPLER + LOADER),
    "top_level": HEAD + SAMPLER + 'if __name__ == "__main__":\n' + _indented(LOADER),
    "local": HEAD
    + "def build():\n"
    + _indented(SAMPLER + "return Counting")
    + '\nif __name__ == "__main__":\n    Counting = build()\n'
    + _indented(LOADER),
}


def _run(tmp_path: Path, argv: list[str], method: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *argv, method],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("guarded", 'is defined under `if __name__ == "__main__":` of '),
        ("local", "is defined inside a function"),
    ],
)
def test_a_sampler_spawned_workers_cannot_rebuild_is_one_line(tmp_path, script, reason):
    (tmp_path / "mine.py").write_text(SCRIPTS[script])
    done = _run(tmp_path, ["mine.py"], "spawn")
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ValueError: sampler Counting (derived from 'sinusoid') cannot reach loader workers "
        "started by "
        "'spawn': class "
    ), done.stderr
    assert reason in last and "num_workers=0 or multiprocessing_context='fork'" in last
    assert "exited unexpectedly" not in done.stderr and "spawn_main" not in done.stderr


@pytest.mark.timeout(120)
def test_a_sampler_typed_into_an_interactive_session_is_one_line(tmp_path):
    code = SCRIPTS["top_level"].replace('if __name__ == "__main__":\n', "if True:\n")
    done = _run(tmp_path, ["-c", code], "spawn")
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "is defined in an interactive session" in last, done.stderr
    assert "exited unexpectedly" not in done.stderr


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_sampler_workers_can_rebuild_still_loads(tmp_path, method):
    (tmp_path / "mine.py").write_text(SCRIPTS["top_level"])
    done = _run(tmp_path, ["mine.py"], method)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "batches 3"
    if method == "fork":  # fork copies the process: a guarded class reaches the workers
        (tmp_path / "guarded.py").write_text(SCRIPTS["guarded"])
        done = _run(tmp_path, ["guarded.py"], method)
        assert done.returncode == 0 and done.stdout.strip() == "batches 3", done.stderr
