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
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from metadist.diskspace import is_out_of_space


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
        # never in place of the write's own error (a read-only directory refuses both)
        with suppress(OSError):
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
        OSError: the directory cannot be created there (`make_directory_beside`).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not replace:
        raise FileExistsError(f"{out_dir} exists")
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    partial = out_dir.parent / f".{out_dir.name}.partial-{tag}"
    make_directory_beside(partial, out_dir)
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


def make_directory_beside(directory: Path, target: Path) -> None:
    """Creates `directory`, a temporary sibling of `target`, and their parent where it is
    missing. An error names `target`, the path the user gave, not the temporary name.

    Raises:
        NotADirectoryError: a file stands where a directory above `target` should be.
        OSError: of the kind the system raised (`PermissionError`, ...), worded as
            `cannot create TARGET: cannot write in DIR (reason)`; a lack of space as it
            came, for `metadist.diskspace.needs_space` to word.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        directory.mkdir()
    except OSError as error:
        if is_out_of_space(error):
            raise
        above = target.parent
        while not os.path.lexists(above) and above != above.parent:
            above = above.parent  # the nearest directory that exists, which refused
        if not above.is_dir():
            raise NotADirectoryError(
                f"cannot create {target}: {above} is not a directory"
            ) from None
        reason = (error.strerror or str(error)).lower()
        raise type(error)(f"cannot create {target}: cannot write in {above} ({reason})") from None


def refuse_working_directory(path: Path, what: str) -> None:
    """Refuses `path` as a directory to replace where it is the working directory or
    contains it: `.` cannot be renamed at all, and renaming the directory a shell stands
    in would leave the shell in a deleted one.

    Raises:
        ValueError: naming `what` (e.g. `OUT_DIR`) and `path`.
    """
    try:
        here = Path.cwd()
    except OSError:  # the working directory was deleted: nothing to protect
        return
    resolved = Path(os.path.realpath(path))  # never raises, not even on a link loop
    if resolved == here or resolved in here.parents:
        raise ValueError(
            f"{what} {str(path) or '.'} is the current directory or contains it; name a new "
            f"directory, e.g. {path / 'data'}"
        )
