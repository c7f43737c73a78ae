"""`benchmarks/entity_ids.py` removes the stores it built in a temporary directory (the
default, without `--dir`) once it has measured them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _benchmark_scripts import BENCHMARKS


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_temporary_stores_are_removed_after_the_run(tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "entity_ids.py"), "--repeats", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temporary)},
        timeout=170,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("| 200,000 short ids |") == 2
    assert list(temporary.glob("metadist-ids-*")) == []
