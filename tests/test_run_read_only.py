"""A run shared as a read-only artifact (a tar.gz unpacked elsewhere, `chmod -R a-w`):
what needs no write works without one, and what would write into it says so in one line
before any work, leaving the run as it was.

Real parts: a tiny store and a run of two meta-steps, packed with its store into a
tar.gz, unpacked in another directory and made read-only; the commands run in their own
processes (for root, which writes anyway, without the capability to override
permissions, as `setpriv` gives it up).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tiny_runs import tiny_store, train_tiny

from metadist.datasets.synthetic import SYNTHETIC_ENTITY

pytestmark = pytest.mark.integration


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and modification time."""
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
    }


def _chmod_tree(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """`{"run", "store", "history"}`: a run and its store unpacked read-only from a
    tar.gz elsewhere (the original gone), and a new entity's history."""
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: permissions cannot be enforced")
    made = tmp_path_factory.mktemp("made")
    store = tiny_store(made, num_entities=12, seed=4)
    train_tiny(store, made / "run", "experiment=synthetic_maml")
    packed = made / "run.tar.gz"
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(made / "run", "shared/run")
        tar.add(made / "store", "shared/store")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    with tarfile.open(packed) as tar:
        # the safe filter where this Python has it (3.10.12, 3.11.4 and later)
        tar.extractall(elsewhere, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    panel = pq.read_table(made / "panel")
    first = panel.column(SYNTHETIC_ENTITY)[0]
    history = elsewhere / "history.parquet"
    pq.write_table(panel.filter(pc.equal(panel[SYNTHETIC_ENTITY], first)), history)
    shutil.rmtree(made)
    _chmod_tree(elsewhere / "shared", writable=False)
    yield {"run": elsewhere / "shared" / "run", "store": elsewhere / "shared" / "store",
           "history": history}  # fmt: skip
    _chmod_tree(elsewhere / "shared", writable=True)


def _metadist(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`metadist ARGS` in its own process, bound by the files' permissions."""
    argv = [sys.executable, "-m", "metadist.cli", *args]
    if os.geteuid() == 0:  # root writes everywhere unless it gives up that capability
        argv = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *argv]
    env = {**os.environ, "METADIST_CACHE": str(cwd / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=cwd, env=env)


@pytest.mark.timeout(300)
def test_a_read_only_run_is_refused_by_eval_before_any_work(shared, tmp_path):
    before = _tree(shared["run"])
    done = _metadist("eval", f"run_dir={shared['run']}", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"error: cannot write the evaluation report in {shared['run']}: permission " in (
        done.stderr
    )
    assert "evaluate a writable copy of the run" in done.stderr
    assert "evaluation:" not in done.stderr  # refused before the tasks are scored
    assert _tree(shared["run"]) == before
    # a writable copy is evaluated (it still finds the store beside it)
    copy = tmp_path / "shared" / "run"
    shutil.copytree(shared["run"], copy)
    shutil.copytree(shared["store"], tmp_path / "shared" / "store")
    _chmod_tree(tmp_path / "shared", writable=True)
    done = _metadist("eval", f"run_dir={copy}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (copy / "eval" / "metrics.json").is_file()


@pytest.mark.timeout(300)
def test_a_read_only_run_forecasts_and_an_out_inside_it_is_refused_first(shared, tmp_path):
    before = _tree(shared["run"])
    out = tmp_path / "forecasts.parquet"
    done = _metadist("forecast", str(shared["run"]), str(shared["history"]), "--out", str(out),
                     cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out).num_rows == 8  # one entity, H steps
    inside = shared["run"] / "forecasts.parquet"
    done = _metadist("forecast", str(shared["run"]), str(shared["history"]), "--out",
                     str(inside), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"metadist forecast: error: cannot write the forecasts (--out {inside}) in "
        f"{shared['run']}: permission denied; write them elsewhere\n"
    )  # one line, before the run is loaded (no note about the history)
    assert _tree(shared["run"]) == before


@pytest.mark.timeout(300)
def test_a_read_only_run_without_a_record_forecasts_with_its_store(shared, tmp_path):
    """A run from before runs kept `inference.json`: loaded with its store, it would gain
    one; read-only, a note says why it did not, in the system's words."""
    old = tmp_path / "old"
    shutil.copytree(shared["run"], old / "run")
    shutil.copytree(shared["store"], old / "store")
    _chmod_tree(old, writable=True)
    (old / "run" / "inference.json").unlink()
    _chmod_tree(old / "run", writable=False)
    try:
        done = _metadist("forecast", str(old / "run"), str(shared["history"]), "--out",
                         str(tmp_path / "f.parquet"), "--store", str(old / "store"),
                         cwd=tmp_path)  # fmt: skip
    finally:
        _chmod_tree(old / "run", writable=True)
    assert done.returncode == 0, done.stderr
    assert (
        f"note: run_dir {old / 'run'}: cannot write inference.json (permission denied); "
        "the run still needs its store to forecast\n"
    ) in done.stderr
    assert not (old / "run" / "inference.json").exists()
