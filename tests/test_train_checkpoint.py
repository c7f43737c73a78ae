"""Checkpoints are whole or absent; truncated and foreign files give clear errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from metadist.train.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from metadist.train.compose import load_config
from metadist.train.logging import read_metrics
from metadist.train.loop import train

TINY_RUN = [
    "experiment=sinusoid_maml",
    "sampler.options.num_tasks=40",
    "model.options.hidden_sizes=[8]",
    "trainer.meta_batch_size=4",
    "logging.progress=false",
    "logging.wandb.mode=disabled",
]


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


# ------------------------------------------------- a lost `latest` never loses work


def _corrupt(path, value: float) -> None:
    """Flips a bit of the learner's weights (all `value`) inside the checkpoint file."""
    data = bytearray(path.read_bytes())
    at = bytes(data).index(torch.full((6,), value).numpy().tobytes())
    data[at + 1] ^= 0x01
    path.write_bytes(bytes(data))


def _three_checkpoints(run_dir) -> list:
    return [save_checkpoint(run_dir, step, state(float(step)), keep=3) for step in (4, 8, 12)]


@pytest.mark.parametrize("how", ["missing", "dangling", "loop"])
def test_a_lost_latest_resumes_from_the_newest_checkpoint_that_verifies(tmp_path, capfd, how):
    paths = _three_checkpoints(tmp_path)
    _corrupt(paths[2], 12.0)  # the newest is damaged (a flipped byte inside a tensor record)
    pointer_path = checkpoint_dir(tmp_path) / "latest"
    pointer_path.unlink()
    if how == "dangling":
        pointer_path.symlink_to(tmp_path / "gone.json")
    elif how == "loop":
        pointer_path.symlink_to(pointer_path)
    found, pointer = latest_checkpoint(tmp_path)
    assert found == paths[1] and pointer["step"] == 8
    assert load_checkpoint(found, pointer)["learner"]["weight"][0, 0] == 8.0
    notes = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(notes) == 1, notes
    assert "resuming from" in notes[0] and "step_00000008.pt" in notes[0], notes[0]
    assert "step_00000012.pt: checkpoint" in notes[0] and "CRC-32" in notes[0], notes[0]
    assert all(p.exists() for p in paths)  # nothing deleted by looking


def test_training_with_a_lost_latest_resumes_instead_of_starting_over(tmp_path, capfd):
    def run(meta_steps: int):
        steps = [f"trainer.meta_steps={meta_steps}", "trainer.checkpoint_every=2"]
        return train(load_config([*TINY_RUN, *steps, f"run_dir={tmp_path}"], world_size=1))

    run(4)
    before = read_metrics(tmp_path)
    run_id = load_checkpoint(*latest_checkpoint(tmp_path))["run_id"]
    (checkpoint_dir(tmp_path) / "latest").unlink()
    capfd.readouterr()
    result = run(6)
    assert result.step == 6
    err = capfd.readouterr().err
    assert "latest is missing; resuming from" in err and "step_00000004.pt" in err, err
    assert read_metrics(tmp_path)[: len(before)] == before  # the first 4 steps' records kept
    assert load_checkpoint(*latest_checkpoint(tmp_path))["run_id"] == run_id


def test_a_lost_latest_with_no_checkpoint_that_verifies_is_refused(tmp_path):
    for path in _three_checkpoints(tmp_path):
        path.write_bytes(path.read_bytes()[:100])
    (checkpoint_dir(tmp_path) / "latest").unlink()
    with pytest.raises(CheckpointError) as caught:
        latest_checkpoint(tmp_path)
    message = str(caught.value)
    assert "latest is missing" in message and "none of the 3 checkpoint(s)" in message
    assert "\n" not in message
    assert len(list(checkpoint_dir(tmp_path).glob("step_*.pt"))) == 3


def test_a_garbage_latest_beside_checkpoints_says_how_to_resume(tmp_path):
    _three_checkpoints(tmp_path)
    (checkpoint_dir(tmp_path) / "latest").write_text("{")
    with pytest.raises(CheckpointError, match="remove it to resume from the newest checkpoint"):
        latest_checkpoint(tmp_path)


def test_pruning_never_deletes_a_checkpoint_of_a_later_step(tmp_path):
    save_checkpoint(tmp_path, 10, state(10.0))
    save_checkpoint(tmp_path, 20, state(20.0))
    save_checkpoint(tmp_path, 5, state(5.0), keep=1)  # a run resumed from further back
    names = sorted(p.name for p in checkpoint_dir(tmp_path).glob("step_*.pt"))
    assert names == ["step_00000005.pt", "step_00000010.pt", "step_00000020.pt"]
    save_checkpoint(tmp_path, 15, state(15.0), keep=1)  # 15 supersedes 5 and 10, not 20
    names = sorted(p.name for p in checkpoint_dir(tmp_path).glob("step_*.pt"))
    assert names == ["step_00000015.pt", "step_00000020.pt"]


def test_the_checkpoint_records_the_step_it_is_saved_as(tmp_path):
    path = save_checkpoint(tmp_path, 3, {**state(1.0), "step": 2, "format": "other"})
    loaded = load_checkpoint(*latest_checkpoint(tmp_path))
    assert loaded["step"] == 3 and loaded["format"] == "metadist-checkpoint"
    assert path.name == "step_00000003.pt"


# ------------------------------------------------- stale temporaries of dead writers


def _interrupted_write(directory, name: str) -> list:
    """A real process that dies while `durable.atomic_file` writes `directory/name`:
    returns the temporaries it left."""
    code = (
        "import os, sys\n"
        "from metadist.durable import atomic_file\n"
        "with atomic_file(sys.argv[1]) as tmp:\n"
        "    tmp.write_bytes(b'half a checkpoint')\n"
        "    os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(directory / name)], check=True, timeout=60)
    return [p for p in directory.iterdir() if p.name.startswith(f".{name}.tmp-")]


def test_the_temporaries_of_killed_writes_are_removed(tmp_path):
    save_checkpoint(tmp_path, 2, state(2.0))
    directory = checkpoint_dir(tmp_path)
    left = _interrupted_write(directory, "step_00000004.pt") + _interrupted_write(
        directory, "latest"
    )
    assert len(left) == 2 and all(p.exists() for p in left)
    ours = directory / f".step_00000006.pt.tmp-{os.getpid()}-0123abcd"  # a live writer's
    ours.write_bytes(b"in progress")
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted(left)
    assert not any(p.exists() for p in left) and ours.exists()
    assert latest_checkpoint(tmp_path)[1]["step"] == 2


# ------------------------------------------------- `checkpoints` as a file


@pytest.mark.parametrize("what", ["file", "dangling link"])
def test_checkpoints_that_is_not_a_directory_is_one_line(tmp_path, what):
    directory = checkpoint_dir(tmp_path)
    if what == "file":
        directory.write_text("not a directory")
    else:
        directory.symlink_to(tmp_path / "elsewhere")
    for call in (lambda: latest_checkpoint(tmp_path), lambda: save_checkpoint(tmp_path, 1, {})):
        with pytest.raises(CheckpointError) as caught:
            call()
        assert str(caught.value).startswith(f"{directory} is ") and "\n" not in str(caught.value)
    assert directory.is_symlink() or directory.read_text() == "not a directory"


def test_a_train_command_with_checkpoints_as_a_file_says_so_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("keep me")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "metadist.train",
            *TINY_RUN,
            "trainer.meta_steps=2",
            f"run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "checkpoints is not a directory" in lines[0], lines
    assert (run_dir / "checkpoints").read_text() == "keep me"


# ------------------------------------------------- a checkpoint of another run


def test_a_checkpoint_copied_in_from_another_run_is_refused(tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    save_checkpoint(mine, 4, {**state(4.0), "run_id": "aaaa1111"})
    save_checkpoint(theirs, 8, {**state(8.0), "run_id": "bbbb2222"})
    assert json.loads((checkpoint_dir(mine) / "run.json").read_text()) == {"run_id": "aaaa1111"}
    for name in ("step_00000008.pt", "latest"):  # the file and its pointer swapped in
        shutil.copy2(checkpoint_dir(theirs) / name, checkpoint_dir(mine) / name)
    with pytest.raises(CheckpointError, match="belongs to run bbbb2222.*records run aaaa1111"):
        load_checkpoint(*latest_checkpoint(mine))
    (checkpoint_dir(mine) / "latest").unlink()  # nor is it picked where `latest` is lost
    with pytest.raises(CheckpointError, match="copied in from another run"):
        latest_checkpoint(mine)
    with pytest.raises(CheckpointError, match="holds the checkpoints of run aaaa1111"):
        save_checkpoint(mine, 12, {**state(12.0), "run_id": "bbbb2222"})
    assert len(list(checkpoint_dir(mine).glob("step_*.pt"))) == 2  # nothing deleted


def test_a_moved_run_and_an_emptied_run_dir_are_accepted(tmp_path):
    save_checkpoint(tmp_path / "a", 4, {**state(4.0), "run_id": "aaaa1111"})
    shutil.move(tmp_path / "a", tmp_path / "b")
    assert load_checkpoint(*latest_checkpoint(tmp_path / "b"))["run_id"] == "aaaa1111"
    for path in checkpoint_dir(tmp_path / "b").glob("step_*.pt"):
        path.unlink()
    (checkpoint_dir(tmp_path / "b") / "latest").unlink()
    save_checkpoint(tmp_path / "b", 2, {**state(2.0), "run_id": "cccc3333"})  # a new run
    assert load_checkpoint(*latest_checkpoint(tmp_path / "b"))["run_id"] == "cccc3333"
