"""Durable writes: a file or a directory appears whole, or not at all, and survives a crash.

Every writer in the package goes through here: checkpoints, run configs and metrics
files, evaluation reports, sweep records, Slurm scripts, data-set directories and the
series store (whose publish step adds an atomic exchange on top, `metadist.store.files`).
A write goes to a hidden temporary sibling, is flushed to disk (`fsync`), renamed over
the target in one step (`os.replace`), and the directory entry is flushed too.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def fsync_path(path: str | os.PathLike) -> None:
    """Flushes a file, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


@contextmanager
def atomic_file(path: str | os.PathLike, durable: bool = True) -> Iterator[Path]:
    """Yields a temporary path next to `path`; once the block has written it, it replaces
    `path` in one step. On an exception nothing changes at `path` and the temporary file
    is removed.

    Example:
        >>> with atomic_file(out / "forecasts.png") as tmp:
        ...     figure.savefig(tmp, format="png")

    Args:
        durable: flush the file and the directory entry to disk (survives a power loss,
            not only a crash of this process).
    """
    path = Path(path)
    temporary = _temporary(path)
    try:
        yield temporary
        if durable:
            fsync_path(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    if durable:
        fsync_path(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    """Writes `data` to `path` atomically (see `atomic_file`)."""
    with atomic_file(path, durable) as temporary:
        temporary.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str, durable: bool = True) -> None:
    """Writes `text` (UTF-8) to `path` atomically (see `atomic_file`)."""
    atomic_write_bytes(path, text.encode("utf-8"), durable)


def atomic_write_json(
    path: str | os.PathLike, value: Any, indent: int | None = 2, durable: bool = True
) -> None:
    """Writes `value` as JSON (one trailing newline) to `path` atomically."""
    atomic_write_text(path, json.dumps(value, indent=indent) + "\n", durable)


@contextmanager
def atomic_directory(out_dir: str | os.PathLike, replace: bool = False) -> Iterator[Path]:
    """Yields a hidden sibling directory to write into; renames it to `out_dir` when the
    block finishes.

    On any exception (or if the process is killed) nothing appears at `out_dir`, and a
    directory already there is left as it was. With `replace`, an existing `out_dir` is
    replaced only once the new one is complete.

    Raises:
        FileExistsError: `out_dir` exists and `replace` is false.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not replace:
        raise FileExistsError(f"{out_dir} exists")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    partial = out_dir.parent / f".{out_dir.name}.partial-{tag}"
    partial.mkdir()
    try:
        yield partial
        for path in partial.iterdir():
            fsync_path(path)
        fsync_path(partial)
        if out_dir.exists():
            retired = out_dir.parent / f".{out_dir.name}.old-{tag}"
            os.rename(out_dir, retired)
            os.rename(partial, out_dir)
            shutil.rmtree(retired)
        else:
            os.rename(partial, out_dir)
        fsync_path(out_dir.parent)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
