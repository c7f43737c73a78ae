"""A run directory that became read-only before a checkpoint: one line naming the
checkpoint and the directory, nothing half-written, and the run resumes once it is
writable again."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_train_loop import assert_bit_identical, params, tiny_config

from metadist.diskspace import UnwritableError
from metadist.durable import atomic_write_bytes
from metadist.train import latest_checkpoint_state, train


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """`directory` read-only for the block: without write permission, or for root (who
    writes anyway) a read-only bind mount of it; skips where neither can be had."""
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)
        return
    mounted = subprocess.run(["mount", "--bind", directory, directory], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount {directory}: {mounted.stderr.decode().strip()}")
    try:
        remount = ["mount", "-o", "remount,ro,bind", directory, directory]
        if subprocess.run(remount, capture_output=True).returncode != 0:
            pytest.skip(f"cannot make {directory} read-only")
        yield
    finally:
        subprocess.run(["umount", directory], check=True)


def test_an_atomic_write_refused_raises_the_writes_own_error(tmp_path):
    """The temporary file cannot be removed either: that must not replace the error."""
    with read_only(tmp_path), pytest.raises(OSError) as raised:
        atomic_write_bytes(tmp_path / "file", b"data")
    assert ".file.tmp-" in str(raised.value.filename)
    assert raised.value.__context__ is None  # not the failed clean-up of the temporary
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_checkpoint_directory_is_one_line_and_the_run_resumes(tmp_path):
    schedule = ["trainer.checkpoint_every=2", "trainer.eval_every=0"]
    straight = train(tiny_config(tmp_path / "straight", *schedule, "trainer.meta_steps=6"))
    run_dir = tmp_path / "run"
    train(tiny_config(run_dir, *schedule, "trainer.meta_steps=2"))
    checkpoints = run_dir / "checkpoints"
    before = sorted(p.name for p in checkpoints.iterdir())
    with read_only(checkpoints), pytest.raises(UnwritableError) as refused:
        train(tiny_config(run_dir, *schedule, "trainer.meta_steps=6"))
    assert str(refused.value) == (
        f"cannot write the checkpoint of step 4 in {checkpoints}: read-only file system; "
        "make it writable, or use another run_dir (nothing half-written was kept)"
        if os.geteuid() == 0
        else f"cannot write the checkpoint of step 4 in {checkpoints}: permission denied; "
        "make it writable, or use another run_dir (nothing half-written was kept)"
    )
    assert sorted(p.name for p in checkpoints.iterdir()) == before
    assert latest_checkpoint_state(run_dir)["step"] == 2
    resumed = train(tiny_config(run_dir, *schedule, "trainer.meta_steps=6"))
    assert resumed.step == 6
    assert_bit_identical(params(resumed.learner), params(straight.learner))
