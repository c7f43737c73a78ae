"""Running out of disk space (or of a file-size limit) as one line naming what needed it.

`OSError: [Errno 28] No space left on device` says neither which file nor what the space
was for; `needs_space` turns it into an `OutOfSpaceError` that says both. The writers
it wraps are atomic already, so nothing half-written is left behind. `may_write` does the
same for a directory the system refuses to write to (read-only, no permission):
`UnwritableError`; `check_writable` finds that out before any work is done.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable, Iterator

# ENOSPC: the device is full; EDQUOT: a quota; EFBIG: a file-size limit (RLIMIT_FSIZE,
# or the file system's largest file).
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class OutOfSpaceError(OSError):
    """A write failed for lack of space; the message names the path and its purpose."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "out of space"


# EROFS: a read-only file system; EACCES, EPERM: no permission
_REFUSED = {errno.EROFS, errno.EACCES, errno.EPERM}


class UnwritableError(OSError):
    """A write the system refused (read-only, no permission); the message names the
    directory and what was written."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "cannot write"


_REMEDY = "make it writable, or use another run_dir (nothing half-written was kept)"


@contextlib.contextmanager
def may_write(directory: str | os.PathLike, what: str, remedy: str = _REMEDY) -> Iterator[None]:
    """Turns a write refused inside the block into an `UnwritableError` naming `directory`
    and `what` (the system's own error names a temporary file, if any), and `remedy`.

    Raises:
        UnwritableError: the file system is read-only, or permission is denied.
    """
    try:
        yield
    except OSError as error:
        if isinstance(error, (OutOfSpaceError, UnwritableError)) or error.errno not in _REFUSED:
            raise
        raise UnwritableError(
            f"cannot write {what} in {directory}: {os.strerror(error.errno).lower()}; {remedy}"
        ) from None


def check_writable(directory: str | os.PathLike, what: str, remedy: str) -> None:
    """Refuses, before any work, a directory this process may not write in (read-only
    file system, no permission), as `may_write` would after it. The system is asked by
    creating an unnamed temporary file there, which leaves nothing behind.

    Raises:
        UnwritableError: naming `directory`, `what` would be written and `remedy`.
    """
    with may_write(directory, what, remedy), tempfile.TemporaryFile(dir=os.fspath(directory)):
        pass


def is_out_of_space(error: BaseException) -> bool:
    """Whether `error` is a write failing for lack of space (device, quota or size limit)."""
    if not isinstance(error, OSError):
        return False
    if error.errno in _NO_SPACE:
        return True
    # pyarrow raises OSError without errno; its message carries the system's text
    text = str(error)
    return error.errno is None and any(os.strerror(code) in text for code in _NO_SPACE)


@contextlib.contextmanager
def needs_space(
    path: str | os.PathLike, what: str, num_bytes: int | Callable[[], int] | None = None
) -> Iterator[None]:
    """Turns a lack of space inside the block into an `OutOfSpaceError` naming `path`.

    Args:
        path: the file or directory being written.
        what: what the space is for, e.g. "the checkpoint of step 500".
        num_bytes: about how much the write needs, when known; or a function that
            computes it, called only if the write fails (for an estimate that costs
            work, such as reading the input; an error in it only drops the figure).

    Raises:
        OutOfSpaceError: the device is full, a quota is reached or a file-size limit hit.
    """
    try:
        yield
    except OSError as error:
        if isinstance(error, OutOfSpaceError) or not is_out_of_space(error):
            raise
        size = _about(num_bytes)
        reason = os.strerror(error.errno or errno.ENOSPC).lower()
        raise OutOfSpaceError(
            f"no space to write {what} at {path}{size}: {reason}; free some space there "
            "or write elsewhere (nothing half-written was kept)"
        ) from None


def _about(num_bytes: int | Callable[[], int] | None) -> str:
    """` (about 23.8 MB)`, or nothing where the size is unknown."""
    if callable(num_bytes):
        try:
            num_bytes = num_bytes()
        except Exception:  # noqa: BLE001 - the message goes out without its figure
            return ""
    return f" (about {_human(num_bytes)})" if num_bytes else ""


def _human(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:,.0f} {unit}" if unit == "bytes" else f"{value:,.1f} {unit}"
        value /= 1000
    return f"{value:,.1f} TB"
