"""Durable writing of a store: preallocated memory-mapped files, and the atomic move of
a finished temporary directory into place."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from metadist.durable import fsync_path, make_directory_beside
from metadist.store.format import is_store

TEMP_MARKER = ".ingest-"
# An ingest writes its temporary directory's files throughout; one whose owner cannot be
# asked (another machine's) and that has not changed for a week was abandoned.
_STALE_SECONDS = 7 * 24 * 3600
_RELEASE_BYTES = 64 << 20  # unmap written pages after this much, to keep RSS flat
PAGE_BYTES = mmap.PAGESIZE


def keep_heap_memory() -> bool:
    """Tells glibc malloc to keep freed memory instead of returning it to the kernel at
    once. Ingest allocates and frees many batch-sized arrays; with the default dynamic
    thresholds each of them costs fresh page faults, a third of the scan's CPU time; Arrow
    is switched to the same allocator (its default, mimalloc, also returns freed pages). Used
    by the `metadist ingest` command only (it changes the whole process). Returns whether
    it applied (glibc on Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    kept = bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 512 << 20))
    if kept:  # Arrow's own allocator hands freed pages back to the kernel: use malloc's
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    return kept


def store_target(out: Path) -> Path:
    """Where the store for `out` is written: `out`, or the path a symbolic link at `out`
    leads to (followed to its end), so the link stays and its target is replaced.

    Raises:
        ValueError: `out` is a symbolic link loop.
        FileNotFoundError: `out` is a link to a path whose parent directory is missing.
    """
    out = Path(out)
    if not out.is_symlink():
        return out
    try:
        target = out.resolve(strict=False)
    except (RuntimeError, OSError):  # a loop (RuntimeError before Python 3.13)
        raise ValueError(
            f"{out} is a symbolic link loop; point it at the store directory or remove it"
        ) from None
    if not target.parent.is_dir():
        raise FileNotFoundError(
            f"{out} is a symbolic link to {target}, whose parent directory does not exist"
        )
    return target


def temp_sibling(out: Path) -> Path:
    """A fresh temporary directory next to the store for `out` (`store_target`), named
    after it, this process and this machine (`.NAME.ingest-PID@HOST-XXXXXXXX`).

    Raises:
        OSError: it cannot be created there (naming `out`, `make_directory_beside`).
    """
    target = store_target(out)
    owner = f"{os.getpid()}@{socket.gethostname()}"  # on a shared file system, whose pid
    temp = target.parent / f".{target.name}{TEMP_MARKER}{owner}-{secrets.token_hex(4)}"
    make_directory_beside(temp, target)
    return temp


class MappedFile:
    """A file of fixed size, memory-mapped read-write as a numpy array.

    Pages touched through the mapping are dropped from this process's page tables once
    about `release_bytes` of them are resident (`MADV_DONTNEED` on a shared file mapping
    keeps their contents in the page cache), so resident memory does not grow with the
    size of the file. Resident memory is read from the kernel where it can be (the
    process's, so one mapping's growth may make another release early); the bound is
    approximate by what the writers add between two checks. Closing
    does not flush: the caller makes the file durable once its contents are final.
    """

    def __init__(
        self,
        path: Path,
        dtype: np.dtype,
        shape: tuple[int, ...],
        existing: bool = False,
        release_bytes: int = _RELEASE_BYTES,
    ):
        self.path = path
        self.release_bytes = release_bytes
        self.size = int(np.prod(shape)) * dtype.itemsize
        self.row_bytes = self.size // max(shape[0], 1)
        flags = os.O_RDWR if existing else os.O_RDWR | os.O_CREAT | os.O_EXCL
        self.fd = os.open(path, flags, 0o644)
        try:
            if not existing:
                _preallocate(self.fd, self.size)
            self.mm = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self.array = np.frombuffer(self.mm, dtype=dtype).reshape(shape)
        self._pending = 0
        self._low, self._high = self.size, 0
        self._lock = threading.Lock()
        self._resident_base = _resident_file_bytes() or 0

    def touched(self, first_row: int, end_row: int, num_rows: int) -> None:
        """Notes that `num_rows` rows lying together within `[first_row, end_row)` were
        read or written."""
        low, high = first_row * self.row_bytes, end_row * self.row_bytes
        pages = (high - low) // PAGE_BYTES + 1
        self._add(
            low, high, lambda: min(num_rows * self.row_bytes + PAGE_BYTES, pages * PAGE_BYTES)
        )

    def wrote(self, rows: np.ndarray) -> None:
        """Notes that the rows `rows` (`[N]`, any order) were written. Where resident
        memory cannot be read, counts the pages they lie on: rows far apart (input dealt
        among files, so that a batch writes every 64th row of its entities) each make a
        page resident, and a count of rows alone would let resident memory grow to the
        size of the file."""
        if rows.size == 0:
            return
        first = int(rows.min()) * self.row_bytes // PAGE_BYTES
        last = int(rows.max()) * self.row_bytes // PAGE_BYTES

        def num_bytes() -> int:
            span = last - first + 1
            if span > 64 * rows.size:  # sparse: at most one page per row
                return min(rows.size, span) * PAGE_BYTES
            on = np.zeros(span, bool)  # a bitmap of the pages spanned is cheap
            on[rows * self.row_bytes // PAGE_BYTES - first] = True
            return int(np.count_nonzero(on)) * PAGE_BYTES

        self._add(first * PAGE_BYTES, (last + 1) * PAGE_BYTES, num_bytes)

    def _add(self, low: int, high: int, num_bytes: Callable[[], int]) -> None:
        """Widens the touched range to `[low, high)` and releases it once about
        `release_bytes` are resident: as the kernel reads it where it can (a fault may
        map a page-cache folio of up to 2 MB), else as `num_bytes()` estimates."""
        with self._lock:
            self._low, self._high = min(self._low, low), max(self._high, high)
            resident = _resident_file_bytes()
            if resident is None:
                self._pending += num_bytes()
                grown = self._pending
            else:
                grown = resident - self._resident_base
            if grown >= self.release_bytes:
                self._release()

    def release(self) -> None:
        """Drops the touched pages from this process's resident memory."""
        with self._lock:
            self._release()

    def release_rows(self, first_row: int, end_row: int) -> None:
        """Drops the pages lying wholly within rows `[first_row, end_row)` from this
        process's page tables, for a caller that will not touch those rows through this
        mapping again (pages shared with the rows around stay mapped). Starting
        writeback of mapped dirty pages makes the kernel write-protect each one in turn,
        with a TLB shootdown per page; pages not mapped cost none."""
        low = -(-first_row * self.row_bytes // PAGE_BYTES) * PAGE_BYTES
        high = end_row * self.row_bytes // PAGE_BYTES * PAGE_BYTES
        if high > low and hasattr(self.mm, "madvise"):
            self.mm.madvise(mmap.MADV_DONTNEED, low, high - low)

    def _release(self) -> None:
        if self._high > self._low and hasattr(self.mm, "madvise"):
            start = self._low - self._low % PAGE_BYTES
            self.mm.madvise(mmap.MADV_DONTNEED, start, self._high - start)
        self._pending = 0
        self._low, self._high = self.size, 0
        self._resident_base = _resident_file_bytes() or 0

    def __enter__(self) -> MappedFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        del self.array
        with contextlib.suppress(BufferError):  # views still referenced: closed on GC
            self.mm.close()
        os.close(self.fd)


class RawFile:
    """Positional reads and writes of whole rows of a store file (pread/pwrite: no page
    faults, safe from several threads at once).

    A new file is sized with `ftruncate`, not reserved with `fallocate`: on ext4, writes
    into reserved (unwritten) extents cost about ten times more than writes into a sparse
    file. A full disk then fails a `write` with ENOSPC (an error, never SIGBUS as with a
    mapping), and the free space is checked up front."""

    def __init__(self, path: Path, row_bytes: int, num_rows: int | None = None) -> None:
        """Opens `path`; with `num_rows`, creates it with room for that many rows."""
        flags = os.O_RDWR if num_rows is None else os.O_RDWR | os.O_CREAT | os.O_EXCL
        self.fd = os.open(path, flags, 0o644)
        self.row_bytes = row_bytes
        if num_rows is not None:
            try:
                _check_space(path, num_rows * row_bytes)
                os.ftruncate(self.fd, num_rows * row_bytes)
            except BaseException:
                os.close(self.fd)
                raise

    def read(self, first_row: int, end_row: int, dtype: np.dtype) -> np.ndarray:
        out = np.empty((end_row - first_row) * self.row_bytes, np.uint8)
        view, offset = memoryview(out.data), first_row * self.row_bytes
        done = 0
        while done < out.size:
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"short read from a store file at byte {offset + done}")
            done += got
        return out.view(dtype)

    def start_writeback(self, first_row: int, end_row: int) -> None:
        """Lets the kernel start writing these rows to disk now (see `start_writeback`)."""
        offset = first_row * self.row_bytes
        start_writeback(self.fd, offset, (end_row - first_row) * self.row_bytes)

    def write(self, first_row: int, rows: np.ndarray) -> None:
        view = memoryview(np.ascontiguousarray(rows).data).cast("B")
        offset = first_row * self.row_bytes
        done = 0
        while done < len(view):
            try:
                done += os.pwritev(self.fd, [view[done:]], offset + done)
            except OSError as error:
                if error.errno == errno.ENOSPC:
                    raise OSError(
                        errno.ENOSPC, "the disk is full: not enough space for the store"
                    ) from error
                raise

    def close(self, sync: bool = False) -> None:
        try:
            if sync:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)

    def __enter__(self) -> RawFile:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self.close(sync=exc_type is None)


_statm: dict[int, int | None] = {}  # process id -> open /proc/self/statm (after a fork,
# an inherited descriptor would still read the parent's)


def _forget_statm() -> None:
    for fd in _statm.values():
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _statm.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_statm)


def _resident_file_bytes() -> int | None:
    """Bytes of file-backed (and shared) memory resident in this process (Linux
    `/proc/self/statm`, 3 us a read), or None where that cannot be read."""
    pid = os.getpid()
    if pid not in _statm:
        try:
            _statm[pid] = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:  # not Linux
            _statm[pid] = None
    fd = _statm[pid]
    if fd is None:
        return None
    try:
        return int(os.pread(fd, 128, 0).split()[2]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def start_writeback(fd: int, offset: int, num_bytes: int) -> None:
    """Starts writing a range of a file to disk without waiting (Linux
    `sync_file_range`), so that the final fsync finds little left to do; a no-op where
    unavailable."""
    if _sync_file_range is not None:
        _sync_file_range(fd, ctypes.c_int64(offset), ctypes.c_int64(num_bytes), 2)


def _load_sync_file_range():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_sync_file_range = _load_sync_file_range()


def _check_space(path: Path, size: int) -> None:
    stat = os.statvfs(path.parent)
    if stat.f_bavail * stat.f_frsize < size:
        raise OSError(errno.ENOSPC, f"not enough disk space for {size} bytes")


def _preallocate(fd: int, size: int) -> None:
    """Reserves `size` bytes, so a full disk fails here rather than as SIGBUS later."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"not enough disk space for {size} bytes") from error
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swaps two paths (Linux renameat2 RENAME_EXCHANGE); False if unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def publish(temp: Path, out: Path) -> None:
    """Moves the finished store into place; an existing store at `out` is replaced in
    one atomic step where the OS allows it. Where `out` is a symbolic link, its target is
    (`store_target`): the link stays."""
    out = store_target(out)
    if out.exists():
        if not is_store(out):
            raise FileExistsError(f"{out} appeared during ingest and is not a series store")
        if not _exchange(temp, out):
            old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
            os.rename(out, old)
            os.rename(temp, out)
            temp = old
        shutil.rmtree(temp, ignore_errors=True)
    else:
        os.rename(temp, out)
    fsync_path(out.parent)


def remove_stale_temps(out: Path) -> None:
    """Removes temporary directories left by ingests into `out` that were killed: this
    machine's whose process is gone. Another machine's (`out` on a shared file system,
    an ingest on another node) and those named by pid alone (an older metadist) cannot be
    asked about their process: they are removed only once nothing in them has changed
    for `_STALE_SECONDS`."""
    out = store_target(out)
    prefix = f".{out.name}{TEMP_MARKER}"
    for candidate in out.parent.glob(f"{prefix}*"):
        owner = candidate.name[len(prefix) :].rsplit("-", 1)[0]  # PID@HOST, or PID
        pid_text, _, host = owner.partition("@")
        if not pid_text.isdigit():
            continue
        if host == socket.gethostname():
            stale = not pid_alive(int(pid_text))
        elif host:  # another machine's
            stale = _untouched_for(candidate, _STALE_SECONDS)
        else:  # named by pid alone (an older metadist), on this machine or another
            stale = not pid_alive(int(pid_text)) and _untouched_for(candidate, _STALE_SECONDS)
        if stale:
            shutil.rmtree(candidate, ignore_errors=True)


def _untouched_for(directory: Path, seconds: float) -> bool:
    """Whether neither `directory` nor a file in it has changed for `seconds`."""
    try:
        paths = [directory, *directory.iterdir()]
        latest = max(path.stat().st_mtime for path in paths)
    except OSError:  # removed meanwhile, or unreadable: leave it
        return False
    return time.time() - latest > seconds


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
