"""Writing a data set directory whole or not at all."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OutputDirNotEmptyError(FileExistsError):
    """`out_dir` is a non-empty directory and `overwrite` was not given.

    The message speaks to Python callers (`overwrite=True`); command-line front ends
    re-raise it with `for_cli`, which names their `--overwrite` flag instead.
    """

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        super().__init__(self._message("overwrite=True"))

    def _message(self, how: str) -> str:
        return (
            f"{self.out_dir} exists and is not empty; choose a new directory or pass "
            f"{how} to replace it"
        )

    def for_cli(self) -> FileExistsError:
        """The same error worded for the command line (`--overwrite`)."""
        return FileExistsError(self._message("--overwrite"))


def check_output_dir(out_dir: str | os.PathLike, overwrite: bool) -> Path:
    """Checks that `out_dir` may be written, before any work is done.

    Raises:
        FileExistsError: `out_dir` is a file.
        OutputDirNotEmptyError: `out_dir` is a non-empty directory and not `overwrite`.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        if not out_dir.is_dir():
            raise FileExistsError(f"{out_dir} exists and is not a directory")
        if not overwrite and any(out_dir.iterdir()):
            raise OutputDirNotEmptyError(out_dir)
    return out_dir


@contextmanager
def atomic_output_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yields a hidden sibling directory to write into; renames it to `out_dir` on success.

    On any exception (or if the process is killed) nothing appears at `out_dir`, and a
    directory already there is left as it was. With `overwrite`, an existing `out_dir`
    is replaced only once the new one is complete.

    Raises:
        FileExistsError: as `check_output_dir`.
    """
    out_dir = check_output_dir(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    partial = out_dir.parent / f".{out_dir.name}.partial-{tag}"
    partial.mkdir()
    try:
        yield partial
        for path in partial.iterdir():
            _fsync(path)
        _fsync(partial)
        if out_dir.exists():
            retired = out_dir.parent / f".{out_dir.name}.old-{tag}"
            os.rename(out_dir, retired)
            os.rename(partial, out_dir)
            shutil.rmtree(retired)
        else:
            os.rename(partial, out_dir)
        _fsync(out_dir.parent)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
