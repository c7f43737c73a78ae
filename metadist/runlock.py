"""One writer per run directory: a lock file held with `fcntl.flock`.

Example:
    >>> with RunLock(run_dir):
    ...     train(config)

The lock is the `flock` on the open file `run_dir/.lock`, so the operating system releases
it when its holder exits or is killed: a lock file a dead holder left behind is simply
taken over. The file also holds the holder's pid and host (JSON), only so that a second
writer's error can say who holds the run directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

LOCK_FILE = ".lock"


class RunLockedError(ValueError):
    """Another process holds the run directory; the message names its pid and host."""


class RunLock:
    """An exclusive lock on a run directory (created if missing), as a context manager.

    Args:
        run_dir: the directory one writer at a time may write to.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Takes the lock, or raises at once (it never waits).

        Raises:
            RunLockedError: another process holds it (named by pid and host).
            ValueError: `run_dir` or its lock file cannot be what they must be (a file
                in the way, no permission).
        """
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise ValueError(
                f"{self.run_dir} is not a directory: it must be the run directory; move it "
                "away or use another run_dir"
            )
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(
                f"cannot create the run directory {self.run_dir}: {_reason(error)}"
            ) from None
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise RunLockedError(
                    f"{self.run_dir} is in use by another writer: {holder} holds "
                    f"{self.path}; wait for it to finish, stop it, or use another run_dir"
                ) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # a holder released and removed it while we waited: try the new one
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": round(time.time())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Removes the lock file and releases the lock (nothing if not held)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still locked, so that no one takes a removed file
        os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise ValueError(
                f"cannot lock {self.run_dir}: {self.path}: {_reason(error)} (it must be the "
                "run directory's lock file, a plain file)"
            ) from None


def read_holder(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The pid and host recorded in `run_dir`'s lock file, or `None` (no file, unreadable).

    The record says who took the lock last; whether it is still held only `flock` knows.
    """
    try:
        record = json.loads((Path(run_dir) / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _holder(fd: int) -> str:
    """'process PID on host HOST', from the lock file's record."""
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode())
        return f"process {int(record['pid'])} on host {record['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (which has not written its pid and host yet)"


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (not one removed by a releasing holder)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _reason(error: OSError) -> str:
    return (error.strerror or str(error)).lower()
