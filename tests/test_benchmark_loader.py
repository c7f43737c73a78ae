"""`benchmarks/loader.py`: a design that fails in its own process is one line naming the
design and the child's reason, not the child's traceback and then the parent's."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _benchmark_scripts import BENCHMARKS


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_failed_design_is_one_line_with_the_childs_reason(tmp_path):
    # 4 entities of 300 steps hold fewer floats than memcpy's batch of 16 windows
    command = [
        *(sys.executable, str(BENCHMARKS / "loader.py"), "--entities", "4", "--steps", "300"),
        *("--repeats", "1", "--seconds", "0.1", "--warmup", "1", "--scale", "2"),
        *("--large-tasks", "4", "--large-tasks-big", "4", "--batch-windows", "16"),
        *("--workdir", str(tmp_path / "work")),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=170)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "loader.py: design memcpy failed: "
        "ValueError: a batch is larger than the store; raise --entities"
    ]
    assert list((tmp_path / "work").iterdir()) == []  # its temporary data removed
