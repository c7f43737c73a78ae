"""Checkpoints are whole or absent; truncated and foreign files give clear errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from metadist.train.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


def state(value: float) -> dict:
    return {
        "learner": {"weight": torch.full((3, 2), value)},
        "loader": {"epoch": np.int64(2), "tasks_consumed": 48},
        "rng": [{"python": (3, (1, 2, 3), None), "numpy": np.arange(4, dtype=np.uint32)}],
        "run_id": "abc123",
    }


def test_round_trip_and_latest_pointer(tmp_path):
    path = save_checkpoint(tmp_path, 10, state(1.0))
    assert path == checkpoint_dir(tmp_path) / "step_00000010.pt"
    found, pointer = latest_checkpoint(tmp_path)
    assert found == path and pointer["step"] == 10
    loaded = load_checkpoint(found, pointer)
    assert loaded["step"] == 10 and loaded["run_id"] == "abc123"
    torch.testing.assert_close(loaded["learner"]["weight"], torch.full((3, 2), 1.0))
    assert loaded["loader"] == {"epoch": 2, "tasks_consumed": 48}
    assert loaded["rng"][0]["python"] == (3, (1, 2, 3), None)
    assert loaded["rng"][0]["numpy"].tolist() == [0, 1, 2, 3]
    assert not [p for p in checkpoint_dir(tmp_path).iterdir() if ".tmp" in p.name]


def test_no_checkpoint_is_none(tmp_path):
    assert latest_checkpoint(tmp_path) is None


def test_keeps_only_the_most_recent(tmp_path):
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, step, state(float(step)), keep=2)
    names = sorted(p.name for p in checkpoint_dir(tmp_path).glob("step_*.pt"))
    assert names == ["step_00000015.pt", "step_00000020.pt"]
    assert latest_checkpoint(tmp_path)[1]["step"] == 20


def test_truncated_checkpoint_is_reported(tmp_path):
    path = save_checkpoint(tmp_path, 3, state(2.0))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    found, pointer = latest_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(found, pointer)
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(found)  # without the pointer, the zip reader notices


def test_corrupt_bytes_are_reported(tmp_path):
    path = save_checkpoint(tmp_path, 3, state(2.0))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_checkpoint(*latest_checkpoint(tmp_path))


def test_foreign_files_are_reported(tmp_path):
    plain = tmp_path / "model.pt"
    torch.save({"weight": torch.zeros(2)}, plain)
    with pytest.raises(CheckpointError, match="not a metadist checkpoint"):
        load_checkpoint(plain)
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(text)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_bad_latest_pointer_is_reported(tmp_path):
    directory = checkpoint_dir(tmp_path)
    directory.mkdir(parents=True)
    (directory / "latest").write_text("garbage")
    with pytest.raises(CheckpointError, match="not a metadist checkpoint pointer"):
        latest_checkpoint(tmp_path)
    (directory / "latest").write_text(json.dumps({"checkpoint": "step_00000007.pt"}))
    with pytest.raises(CheckpointError, match="does not exist"):
        latest_checkpoint(tmp_path)


def test_failed_write_leaves_the_previous_checkpoint_current(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 4, state(4.0))

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 8, state(8.0))
    monkeypatch.undo()
    found, pointer = latest_checkpoint(tmp_path)
    assert pointer["step"] == 4
    assert load_checkpoint(found, pointer)["learner"]["weight"][0, 0] == 4.0
    assert not (checkpoint_dir(tmp_path) / "step_00000008.pt").exists()
    assert not [p for p in checkpoint_dir(tmp_path).iterdir() if ".tmp" in p.name]


def test_newer_format_version_is_refused(tmp_path):
    path = tmp_path / "future.pt"
    torch.save({"format": "metadist-checkpoint", "version": 99, "step": 1}, path)
    with pytest.raises(CheckpointError, match="format version 99"):
        load_checkpoint(path)
