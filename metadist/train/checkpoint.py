"""Checkpoints that are either whole or absent.

Layout in a run directory::

    checkpoints/step_00000500.pt   torch.save of a dict (format, version, step, state...)
    checkpoints/latest             JSON: {"checkpoint": "step_00000500.pt", "step": 500,
                                          "num_bytes": ..., "sha256": ...}
    checkpoints/run.json           JSON: {"run_id": ...}, the run the checkpoints belong to
    checkpoints/best               JSON: as `latest`, plus {"split": "val", "metric": ...,
                                          "mode": ..., "value": ...}; best.json beside
                                          the run's metrics: the same, no size or hash

A checkpoint is written to a temporary sibling, fsynced and renamed into place; only then
is `latest` rewritten the same way, so a crash at any moment leaves `latest` pointing at
a complete file. Loading checks the size and SHA-256 recorded in `latest` and the
format marker inside the file, so a truncated or foreign file gives a clear
`CheckpointError` instead of a confusing unpickling traceback.

Work is never lost to a damaged pointer: when `latest` is missing (or a dangling or
looping link, or cannot be read) while checkpoints exist, the newest checkpoint that
loads and verifies (the CRC-32 of every record of its zip archive, the format marker,
the run it belongs to) is resumed from, with a note on stderr; when none verifies, the
run is refused. A checkpoint is deleted only once a newer one has been written (and the
one `best` points at never is), and one copied in from another run (its `run_id` differs
from `run.json`'s) is refused. `best` is moved after `latest`, the same way.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from metadist.diskspace import needs_space
from metadist.durable import atomic_write_bytes
from metadist.store.files import pid_alive
from metadist.train.checkpoint_use import TRAINING, CheckpointUse

CHECKPOINT_FORMAT = "metadist-checkpoint"
CHECKPOINT_VERSION = 1
LATEST = "latest"
BEST = "best"
BEST_RECORD = "best.json"  # in the run directory
RUN_RECORD = "run.json"
_NAME = re.compile(r"^step_(\d{8,})\.pt$")
# `durable.atomic_file`'s temporaries: `.NAME.tmp-PID-HEX` (`.NAME.tmp-PID` before it).
_TEMPORARY = re.compile(r"^\..+\.tmp-(\d+)(?:-[0-9a-f]+)?$")


class CheckpointError(ValueError):
    """A checkpoint file that is truncated, corrupt, foreign or from a newer version."""


class ForeignCheckpointError(CheckpointError):
    """A checkpoint of another run (its `run_id` is not the one `run.json` records)."""


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of `step` is written."""
    return checkpoint_dir(run_dir) / f"step_{int(step):08d}.pt"


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    state: dict[str, Any],
    *,
    keep: int = 2,
    best: dict[str, Any] | None = None,
) -> Path:
    """Writes `state` as the checkpoint of `step` and moves `latest` to it.

    Args:
        run_dir: the run directory (created if missing).
        step: the meta-step the state is at (steps completed).
        state: tensors, numbers, strings, lists and dicts (numpy values are converted);
            its `run_id`, if any, is recorded in `run.json` by the first checkpoint.
        keep: how many most recent checkpoints to keep; older ones are deleted after
            `latest` has moved. Checkpoints of later steps than `step` are kept.
        best: the meta-val record (`Selection.record`) of a checkpoint that is the run's
            best so far: `best` (and `best.json`) then move to it, after `latest`.

    Returns:
        The path of the new checkpoint file.

    Raises:
        CheckpointError: `checkpoints` or `latest` is not what it must be, or the
            directory holds the checkpoints of another run.
    """
    directory = _directory(run_dir, create=True)
    assert directory is not None  # created
    run_id = str(state.get("run_id") or "")
    unclaimed = bool(run_id) and _claim_needed(directory, run_id)
    payload = _plain(state)
    payload.update({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "step": int(step)})
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    path = checkpoint_path(run_dir, step)
    _check_pointer_is_a_file(directory / LATEST)
    with needs_space(path, f"the checkpoint of step {int(step)}", len(data)):
        atomic_write_bytes(path, data)
    if unclaimed:
        record = (json.dumps({"run_id": run_id}) + "\n").encode()
        with needs_space(directory / RUN_RECORD, "the record of the run's identity"):
            atomic_write_bytes(directory / RUN_RECORD, record)
    pointer = {
        "checkpoint": path.name,
        "step": int(step),
        "num_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    _write_json(directory / LATEST, pointer, f"the pointer to the checkpoint of step {int(step)}")
    if best is not None:
        write_best(directory, {**pointer, **best})
    _prune(directory, keep=keep, current=path.name)
    return path


def latest_checkpoint(
    run_dir: str | os.PathLike, use: CheckpointUse = TRAINING
) -> tuple[Path, dict] | None:
    """`(path, pointer)` of the run's latest checkpoint, or `None` if it has none.

    When `latest` is missing, a dangling or looping link, or cannot be read while
    checkpoints exist, the newest checkpoint that verifies is returned instead (a note on
    stderr says so), with a pointer holding its size and SHA-256. `use` (who reads it)
    words the note and the errors' remedies.

    Raises:
        CheckpointError: `latest` is not a pointer or points at a missing file;
            `checkpoints` is not a directory; no checkpoint verifies where `latest` is
            gone; the newest checkpoint is another run's.
    """
    directory = _directory(run_dir, create=False, use=use)
    if directory is None:
        return None
    remove_stale_temporaries(run_dir)
    pointer_path = directory / LATEST
    gone = _absence(pointer_path)
    if gone is not None:
        return _newest_verified(directory, f"{pointer_path} {gone}", use)
    remedy = use.latest_damaged if _checkpoint_names(directory) else use.nothing_left
    _check_pointer_is_a_file(pointer_path, remedy)
    try:
        return read_pointer(pointer_path, remedy)
    except OSError as error:
        why = f"{pointer_path} cannot be read ({error.strerror})"
        return _newest_verified(directory, why, use)


def read_pointer(pointer_path: Path, remedy: str) -> tuple[Path, dict]:
    """`(path, pointer)` of a pointer file (`latest`, `best`); `OSError` where it cannot be
    read, `CheckpointError` (saying `remedy`) where it is no pointer or its file is gone."""
    try:
        pointer = json.loads(pointer_path.read_text())
        name = pointer["checkpoint"]
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"{pointer_path} is not a metadist checkpoint pointer ({error}); {remedy}"
        ) from None
    path = pointer_path.parent / str(name)
    if not isinstance(name, str) or not _NAME.match(name) or not path.is_file():
        raise CheckpointError(f"{pointer_path} points at {name!r}, which does not exist; {remedy}")
    return path, pointer


def selected_checkpoint(
    run_dir: str | os.PathLike, which: str = "best", use: CheckpointUse = TRAINING
) -> tuple[Path, dict] | None:
    """`(path, pointer)` of the checkpoint a run is evaluated or used with: its best on
    meta-val where `which` is "best" and it has one (`checkpoints/best`), else its latest
    (`latest_checkpoint`, worded for `use`); `None` without a checkpoint.
    `CheckpointError` where `best` cannot be read, is no pointer or its file is gone, and
    as in `latest_checkpoint`."""
    pointer_path = checkpoint_dir(run_dir) / BEST
    if which != "best" or not (pointer_path.exists() or pointer_path.is_symlink()):
        return latest_checkpoint(run_dir, use)
    _check_pointer_is_a_file(pointer_path, use.best_damaged)
    try:
        return read_pointer(pointer_path, use.best_damaged)
    except OSError as error:
        raise CheckpointError(
            f"{pointer_path} cannot be read ({error.strerror}); {use.best_damaged}"
        ) from None


def write_best(directory: Path, pointer: dict[str, Any]) -> None:
    """Moves `best` to `pointer`, then rewrites the run's `best.json` (no size or hash)."""
    _check_pointer_is_a_file(directory / BEST)
    _write_json(directory / BEST, pointer, "the pointer to the best checkpoint")
    record = {k: v for k, v in pointer.items() if k not in ("num_bytes", "sha256")}
    _write_json(directory.parent / BEST_RECORD, record, "the record of the best checkpoint")


def best_name(directory: Path) -> str | None:
    """The checkpoint `best` points at, or `None` (no pointer, or one that cannot be read)."""
    try:
        return read_pointer(directory / BEST, "")[0].name
    except (OSError, CheckpointError):
        return None


def load_checkpoint(
    path: str | os.PathLike, pointer: dict | None = None, use: CheckpointUse = TRAINING
) -> dict[str, Any]:
    """Reads a checkpoint written by `save_checkpoint` (tensors on the CPU).

    Args:
        path: the checkpoint file.
        pointer: the `latest` record for it; its size and SHA-256 are checked. Without
            it, the CRC-32 of every record of the file's zip archive is.
        use: who reads it, for the remedy of a checkpoint of another run.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: truncated, corrupt, not a metadist checkpoint, or a newer format.
        ForeignCheckpointError: a checkpoint of another run than the one its directory's
            `run.json` records.
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
    else:
        _check_archive(path, data)
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"checkpoint {path} cannot be read (truncated, corrupt or not a torch file): "
            f"{_first_line(error)}"
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
    _check_belongs(path, payload, use)
    return payload


def _check_archive(path: Path, data: bytes) -> None:
    """The CRC-32 of every record of the checkpoint's zip archive (torch.load reads none)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise CheckpointError(
            f"checkpoint {path} cannot be read (truncated, corrupt or not a torch file): "
            f"{_first_line(error)}"
        ) from None
    if bad is not None:
        raise CheckpointError(f"checkpoint {path} is corrupt: the CRC-32 of {bad} does not match")


def _check_belongs(path: Path, payload: dict[str, Any], use: CheckpointUse) -> None:
    """Refuses a checkpoint whose `run_id` is not the one its directory's `run.json` records."""
    run_id = payload.get("run_id")
    recorded = _recorded_run(path.parent)
    if recorded is not None and isinstance(run_id, str) and run_id and run_id != recorded:
        raise ForeignCheckpointError(
            f"checkpoint {path} belongs to run {run_id}, but {path.parent / RUN_RECORD} "
            f"records run {recorded}: it was copied in from another run; {use.foreign}"
        )


def _recorded_run(directory: Path) -> str | None:
    """The `run_id` of `directory/run.json`, or `None` where there is none."""
    record_path = directory / RUN_RECORD
    if not record_path.exists():
        return None
    try:
        run_id = json.loads(record_path.read_text())["run_id"]
        if not isinstance(run_id, str) or not run_id:
            raise TypeError(f"run_id {run_id!r} is not a run id")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"{record_path} is not a metadist run record ({_first_line(error)}); it names the "
            "run the checkpoints beside it belong to: remove it to accept them as this run's"
        ) from None
    return run_id


def _claim_needed(directory: Path, run_id: str) -> bool:
    """Whether `run.json` must be (re)written to record `run_id` as the run the checkpoints
    of `directory` belong to.

    Raises:
        CheckpointError: the directory holds checkpoints of another recorded run.
    """
    recorded = _recorded_run(directory)
    if recorded == run_id:
        return False
    if recorded is not None and _checkpoint_names(directory):
        raise CheckpointError(
            f"{directory} holds the checkpoints of run {recorded} ({RUN_RECORD}), not of "
            f"this run {run_id}; use another run_dir"
        )
    return True


def _directory(
    run_dir: str | os.PathLike, *, create: bool, use: CheckpointUse = TRAINING
) -> Path | None:
    """The run's checkpoint directory (created with `create`), or `None` if there is none.

    Raises:
        CheckpointError: the run directory or `checkpoints` is a file or a dangling link.
    """
    directory = checkpoint_dir(run_dir)
    for path, what in ((Path(run_dir), "the run directory"), (directory, "its checkpoints")):
        if path.is_symlink() and not path.exists():
            raise CheckpointError(
                f"{path} is a dangling symbolic link: it must be a directory holding {what}; "
                f"{use.misplaced}"
            )
        if path.exists() and not path.is_dir():
            raise CheckpointError(
                f"{path} is not a directory: it must hold {what}; {use.misplaced}"
            )
    if create:
        directory.mkdir(parents=True, exist_ok=True)
    return directory if directory.is_dir() else None


def _absence(pointer_path: Path) -> str | None:
    """How `latest` is gone (missing, a dangling or looping link, unreadable), or `None`."""
    try:
        os.stat(pointer_path)
    except FileNotFoundError:
        if os.path.islink(pointer_path):
            return f"is a dangling symbolic link (to {os.readlink(pointer_path)})"
        return "is missing"
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a symbolic link loop"
        return f"cannot be read ({error.strerror})"
    return None


def _newest_verified(directory: Path, why: str, use: CheckpointUse) -> tuple[Path, dict] | None:
    """`(path, pointer)` of the newest checkpoint in `directory` that loads and verifies,
    where `latest` is gone (`why`; its note and error worded for `use`); `None` where
    there is no checkpoint at all.

    Raises:
        CheckpointError: none verifies, or the newest that loads is another run's.
    """
    names = _checkpoint_names(directory)
    if not names:
        return None
    skipped: list[str] = []
    for name in reversed(names):
        path = directory / name
        try:
            payload = load_checkpoint(path, use=use)
            data = path.read_bytes()
        except ForeignCheckpointError:
            raise
        except (OSError, CheckpointError) as error:
            skipped.append(f"{name}: {_first_line(error)}")
            continue
        pointer = {
            "checkpoint": name,
            "step": step if isinstance(step := payload.get("step"), int) else _step_of(name),
            "num_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        if os.environ.get("RANK", "0") == "0":
            passed = f" (skipped {'; '.join(skipped)})" if skipped else ""
            print(
                f"note: {why}; {use.reading} {path}, the newest checkpoint that verifies{passed}",
                file=sys.stderr,
            )
        return path, pointer
    raise CheckpointError(
        f"{why}, and none of the {len(names)} checkpoint(s) in {directory} verifies "
        f"({skipped[0]}); {use.none_verifies}"
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _check_pointer_is_a_file(pointer_path: Path, remedy: str = TRAINING.misplaced) -> None:
    if pointer_path.exists() and not pointer_path.is_file():
        raise CheckpointError(
            f"{pointer_path} is not a file: it must be the pointer to the {pointer_path.name} "
            f"checkpoint (JSON); {remedy}"
        )


def remove_stale_temporaries(run_dir: str | os.PathLike) -> list[Path]:
    """Deletes the temporaries of checkpoint writes whose process is dead (killed mid-write).

    A temporary is `.NAME.tmp-PID-HEX` (`durable.atomic_file`; `.NAME.tmp-PID` before);
    those of live processes (a write in progress) stay.

    Returns:
        The paths deleted.
    """
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    removed = []
    for candidate in directory.glob(".*.tmp-*"):
        match = _TEMPORARY.match(candidate.name)
        if match and candidate.is_file() and not pid_alive(int(match.group(1))):
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


def _write_json(path: Path, value: dict[str, Any], what: str) -> None:
    """Writes `value` as indented JSON to `path`, atomically (`what` names it when the
    disk is full)."""
    with needs_space(path, what):
        atomic_write_bytes(path, (json.dumps(value, indent=1) + "\n").encode())


def _step_of(name: str) -> int:
    match = _NAME.match(name)
    assert match is not None  # only names that matched are sorted
    return int(match.group(1))


def _checkpoint_names(directory: Path) -> list[str]:
    """The names of the checkpoint files in `directory`, oldest step first."""
    return sorted((p.name for p in directory.iterdir() if _NAME.match(p.name)), key=_step_of)


def _prune(directory: Path, *, keep: int, current: str) -> None:
    """Deletes all but the `keep - 1` newest checkpoints older than `current`, sparing the
    one `best` points at; the newer ones (of steps a resumed run has not reached again)
    are never superseded, so stay."""
    best = best_name(directory)
    older = [
        n for n in _checkpoint_names(directory) if _step_of(n) < _step_of(current) and n != best
    ]
    for name in older[: max(len(older) - (keep - 1), 0)]:
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
