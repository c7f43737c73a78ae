"""Writing a data set directory whole or not at all (`metadist.durable`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from metadist.diskspace import needs_space
from metadist.durable import atomic_directory, refuse_working_directory
from metadist.stop_signals import stops_raised


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
        ValueError: `out_dir` is the working directory or contains it.
        FileExistsError: `out_dir` is a file.
        OutputDirNotEmptyError: `out_dir` is a non-empty directory and not `overwrite`.
    """
    out_dir = Path(out_dir)
    refuse_working_directory(out_dir, "OUT_DIR")
    if out_dir.exists():
        if not out_dir.is_dir():
            raise FileExistsError(f"{out_dir} exists and is not a directory")
        if not overwrite and any(out_dir.iterdir()):
            raise OutputDirNotEmptyError(out_dir)
    return out_dir


@contextmanager
def atomic_output_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yields a hidden sibling directory to write into; renames it to `out_dir` on success
    (`metadist.durable.atomic_directory`), after `check_output_dir`. SIGTERM and SIGHUP
    inside the block raise `Stopped` (`metadist.stop_signals`), so the hidden directory is
    removed then too.

    Raises:
        ValueError, FileExistsError: as `check_output_dir`.
        OSError: `out_dir` cannot be created there (naming it).
        OutOfSpaceError: the disk or a file-size limit ran out (nothing is left behind).
        Stopped: SIGTERM or SIGHUP arrived (nothing is left behind).
    """
    out_dir = check_output_dir(out_dir, overwrite)
    with (
        stops_raised(),
        needs_space(out_dir, "the data set"),
        atomic_directory(out_dir, replace=True) as partial,
    ):
        yield partial
