"""Checkpoints that are either whole or absent.

Layout in a run directory::

    checkpoints/step_00000500.pt   torch.save of a dict (format, version, step, state...)
    checkpoints/latest             JSON: {"checkpoint": "step_00000500.pt", "step": 500,
                                          "num_bytes": ..., "sha256": ...}

A checkpoint is written to a temporary sibling, fsynced and renamed into place; only then
is `latest` rewritten the same way, so a crash at any moment leaves `latest` pointing at
a complete file. Loading checks the size and SHA-256 recorded in `latest` and the
format marker inside the file, so a truncated or foreign file gives a clear
`CheckpointError` instead of a confusing unpickling traceback.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from metadist.diskspace import needs_space
from metadist.durable import atomic_write_bytes
from metadist.store.files import pid_alive

CHECKPOINT_FORMAT = "metadist-checkpoint"
CHECKPOINT_VERSION = 1
LATEST = "latest"
_NAME = re.compile(r"^step_(\d{8,})\.pt$")


class CheckpointError(ValueError):
    """A checkpoint file that is truncated, corrupt, foreign or from a newer version."""


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of `step` is written."""
    return checkpoint_dir(run_dir) / f"step_{int(step):08d}.pt"


def save_checkpoint(
    run_dir: str | os.PathLike, step: int, state: dict[str, Any], *, keep: int = 2
) -> Path:
    """Writes `state` as the checkpoint of `step` and moves `latest` to it.

    Args:
        run_dir: the run directory (created if missing).
        step: the meta-step the state is at (steps completed).
        state: tensors, numbers, strings, lists and dicts (numpy values are converted).
        keep: how many most recent checkpoints to keep; older ones are deleted after
            `latest` has moved.

    Returns:
        The path of the new checkpoint file.
    """
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "step": int(step)}
    payload.update(_plain(state))
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    path = checkpoint_path(run_dir, step)
    _check_pointer_is_a_file(directory / LATEST)
    with needs_space(path, f"the checkpoint of step {int(step)}", len(data)):
        _atomic_write(path, data)
    pointer = {
        "checkpoint": path.name,
        "step": int(step),
        "num_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    with needs_space(directory / LATEST, f"the pointer to the checkpoint of step {int(step)}"):
        _atomic_write(directory / LATEST, (json.dumps(pointer, indent=1) + "\n").encode())
    _prune(directory, keep=keep, current=path.name)
    return path


def latest_checkpoint(run_dir: str | os.PathLike) -> tuple[Path, dict] | None:
    """`(path, pointer)` of the run's latest checkpoint, or `None` if it has none.

    Raises:
        CheckpointError: `latest` is unreadable or points at a missing file.
    """
    remove_stale_temporaries(run_dir)
    pointer_path = checkpoint_dir(run_dir) / LATEST
    if not pointer_path.exists():
        return None
    _check_pointer_is_a_file(pointer_path)
    try:
        pointer = json.loads(pointer_path.read_text())
        name = pointer["checkpoint"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"{pointer_path} is not a metadist checkpoint pointer ({error}); "
            "remove it or use another run_dir"
        ) from None
    path = pointer_path.parent / name
    if not _NAME.match(name) or not path.is_file():
        raise CheckpointError(f"{pointer_path} points at {name!r}, which does not exist")
    return path, pointer


def load_checkpoint(path: str | os.PathLike, pointer: dict | None = None) -> dict[str, Any]:
    """Reads a checkpoint written by `save_checkpoint` (tensors on the CPU).

    Args:
        path: the checkpoint file.
        pointer: the `latest` record for it; its size and SHA-256 are checked.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: truncated, corrupt, not a metadist checkpoint, or a newer format.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    data = path.read_bytes()
    if pointer is not None:
        if len(data) != pointer.get("num_bytes"):
            raise CheckpointError(
                f"checkpoint {path} is truncated or corrupt: {len(data)} bytes on disk, "
                f"{pointer.get('num_bytes')} written"
            )
        if hashlib.sha256(data).hexdigest() != pointer.get("sha256"):
            raise CheckpointError(f"checkpoint {path} is corrupt: its SHA-256 does not match")
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"checkpoint {path} cannot be read (truncated, corrupt or not a torch file): "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} is not a metadist checkpoint (no format marker {CHECKPOINT_FORMAT!r})"
        )
    if payload.get("version", 0) > CHECKPOINT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {payload['version']}; this metadist "
            f"reads up to {CHECKPOINT_VERSION}"
        )
    return payload


def _check_pointer_is_a_file(pointer_path: Path) -> None:
    if pointer_path.exists() and not pointer_path.is_file():
        raise CheckpointError(
            f"{pointer_path} is not a file: it must be the pointer to the latest checkpoint "
            "(JSON); remove it or use another run_dir"
        )


def remove_stale_temporaries(run_dir: str | os.PathLike) -> list[Path]:
    """Deletes the temporaries of checkpoint writes whose process is dead (killed mid-write).

    A temporary is `.NAME.tmp-PID`; those of live processes (a write in progress) stay.

    Returns:
        The paths deleted.
    """
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    removed = []
    for candidate in directory.glob(".*.tmp-*"):
        pid_text = candidate.name.rpartition(".tmp-")[2]
        if pid_text.isdigit() and candidate.is_file() and not pid_alive(int(pid_text)):
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


def _atomic_write(path: Path, data: bytes) -> None:
    atomic_write_bytes(path, data)


def _step_of(name: str) -> int:
    match = _NAME.match(name)
    assert match is not None  # only names that matched are sorted
    return int(match.group(1))


def _prune(directory: Path, *, keep: int, current: str) -> None:
    names = sorted(
        (p.name for p in directory.iterdir() if _NAME.match(p.name)),
        key=_step_of,
    )
    for name in names[:-keep]:
        if name != current:
            (directory / name).unlink(missing_ok=True)


def _plain(value: Any) -> Any:
    """Numpy values → Python/torch ones, so that `weights_only` loading accepts them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    return value


def latest_checkpoint_state(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The contents of the run's latest checkpoint.

    Raises:
        FileNotFoundError: the run has no checkpoint.
        CheckpointError: as in `load_checkpoint`.
    """
    found = latest_checkpoint(run_dir)
    if found is None:
        raise FileNotFoundError(f"run directory {run_dir} has no checkpoint")
    return load_checkpoint(*found)
