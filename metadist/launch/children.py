"""Processes a command starts, stopped with it: a stop signal reaches every one.

`metadist train --nproc-per-node`, `metadist competition` and the demo start torchrun or
trainings of their own. Stopped by SIGTERM, SIGUSR1 (as SIGTERM, which torchrun passes
on) or Ctrl-C, the command forwards the signal to each child (torchrun stops its ranks, a training checkpoints), waits a grace period, then
kills whatever of the children and their descendants is still alive — ranks run in
sessions of their own, so they are found through `/proc`, not by process group. The
command then says in one line what it stopped and exits with 128 + the signal's number.
Killed outright (SIGKILL, which it cannot catch), it forwards nothing: on Linux each
child is started asking the kernel for a SIGTERM when the command ends
(`PR_SET_PDEATHSIG`), so torchrun stops its ranks and a training checkpoints and stops
instead of training on unobserved.

Example:
    with OwnedChildren("metadist train") as children:
        status = children.call(["python", "-m", "metadist.launch.torchrun", ...])
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

# SIGUSR1: what Slurm sends before a preemption (`--signal=USR1@120`); by default it would
# end this command at once, its children left unreported (they are sent SIGTERM for it)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


def forwarded(signum: int) -> int:
    """The signal a child is sent for the stop signal `signum`: SIGUSR1 as SIGTERM (the
    same stop to a training, and one torchrun passes on to its ranks), others as they are."""
    return signal.SIGTERM if signum == signal.SIGUSR1 else signum


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl() -> Callable[..., int] | None:
    """libc's `prctl` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def stop_with_parent_hook() -> Callable[[], None] | None:
    """A `preexec_fn` for a child that must end with this process: in the child, before
    the exec, it asks the kernel for a SIGTERM once the thread that started it ends (the
    process killed by SIGKILL included), and sends it at once if that already happened.
    None where the kernel has no such request (not Linux)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def hook() -> None:  # runs between fork and exec: nothing but two system calls
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent ended before the request was made
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


class StopRequested(BaseException):
    """A stop signal reached the command; its children are stopped (see `summary`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.summary = f"stopped by {signal.Signals(signum).name}"

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (children, their children, ...), from `/proc`."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


class OwnedChildren:
    """Starts subprocesses and stops them all when a stop signal reaches this process.

    Use it as a context manager in the main thread: on entry it takes SIGTERM, SIGINT and
    SIGHUP; a signal raises `StopRequested` in the command, and leaving the block
    forwards it to every running child and waits for them (`StopRequested.summary` then
    says how many processes were stopped). On exit (also by an error) every
    child still running is stopped the same way, and the old handlers come back.

    Args:
        name: the command, for messages (`metadist train`).
        grace_s: how long children may take to stop after the signal before SIGKILL.
    """

    def __init__(self, name: str, grace_s: float = 60.0) -> None:
        self.name = name
        self.grace_s = grace_s
        self._running: list[subprocess.Popen] = []
        self._previous: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        self._before: set[int] = set()  # processes below this one before the block
        self._forked: set[int] = set()  # those forked since, found when a stop came

    _active: OwnedChildren | None = None  # the block being run in this process

    def __enter__(self) -> OwnedChildren:
        self._pid = os.getpid()
        self._before = set(descendants(self._pid))
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        OwnedChildren._active = self
        return self

    @classmethod
    def popen_owned(cls, command: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """`Popen` through the block this process is running in (so a stop signal reaches
        the child), or a plain `Popen` outside any block."""
        owner = cls._active
        if owner is None:
            return subprocess.Popen(list(command), **kwargs)
        return owner.popen(command, **kwargs)

    @classmethod
    def release(cls, process: subprocess.Popen) -> None:
        """`process`, started by `popen_owned`, ended and was waited for."""
        if cls._active is not None:
            cls._active.forget(process)

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        with self._lock:
            self._closed = True  # from now on no thread may start another child
        try:
            if isinstance(error, StopRequested):
                count = self.stop_all(forwarded(error.signum)) + self._stop_forked()
                plural = "es" if count != 1 else ""
                error.summary += f"; {count} process{plural} it started stopped"
            else:
                self.stop_all(signal.SIGTERM)
        finally:
            OwnedChildren._active = None
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)

    def popen(self, command: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """`subprocess.Popen(command, **kwargs)`, owned: stopped with this command.

        Safe from several threads. Raises `RuntimeError` once the block is being left
        (a stop is under way), so no child starts after the others were stopped.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is stopping: no new process is started")
            if "preexec_fn" not in kwargs:  # a SIGKILL of this command still stops it
                kwargs["preexec_fn"] = stop_with_parent_hook()
            process = subprocess.Popen(list(command), **kwargs)
            self._running.append(process)
        return process

    def call(self, command: Sequence[str], **kwargs: Any) -> int:
        """Runs `command` to its end (as `subprocess.call`) and returns its exit status."""
        process = self.popen(command, **kwargs)
        status = process.wait()
        self.forget(process)
        return status

    def forget(self, process: subprocess.Popen) -> None:
        """`process` ended and was waited for by the caller."""
        with self._lock:
            if process in self._running:
                self._running.remove(process)

    def stop_all(self, signum: int) -> int:
        """Sends `signum` to every running child, waits up to `grace_s` for them and
        everything below them, then kills what is left. Returns how many processes were
        running (children and their descendants)."""
        with self._lock:
            running = [p for p in self._running if p.poll() is None]
            self._running = []
        if not running:
            return 0
        below = {pid for p in running for pid in descendants(p.pid)}
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            below |= {pid for p in running if p.poll() is None for pid in descendants(p.pid)}
            if all(p.poll() is not None for p in running) and not any(map(alive, below)):
                break
            time.sleep(0.1)
        for pid in [p.pid for p in running if p.poll() is None] + sorted(below):
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for process in running:
            process.wait()
        return len(running) + len(below)

    def _stop_forked(self) -> int:
        """Sends SIGTERM to the processes forked below this one during the block, not
        started through it (an evaluation's worker pool), and returns how many there
        were when the stop came (`_on_signal`); each ends quietly (`_on_signal` in a
        forked copy), or is killed after `grace_s`."""
        counted = self._forked | (set(descendants(self._pid)) - self._before)
        forked = [pid for pid in counted if alive(pid)]
        for pid in forked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(map(alive, forked)):
            time.sleep(0.1)
        for pid in forked:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return len(counted)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A forked copy of the command (a worker pool's process) inherited this
            # handler. A terminal's Ctrl-C reaches it with the command, whose own
            # handler lists it and ends it with SIGTERM at once (below), so it is
            # counted; any other stop ends it here, quietly: the command reports it.
            if signum != signal.SIGINT:
                os._exit(128 + signum)
            return
        # What was forked below this process during the block (not the started
        # children's trees), as the stop finds them: counted, and told to end now, so
        # that a pool the command closes on its way out (waiting for its tasks) is
        # broken at once rather than waited for.
        started = {p.pid for p in list(self._running)}
        below = set(descendants(self._pid)) - self._before
        for pid in started:
            below -= {pid, *descendants(pid)}
        self._forked = below
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        # Only raise here: the handler may run inside `Popen.wait`, which holds a lock
        # that `stop_all` needs. The children are stopped in `__exit__`.
        for handled in STOP_SIGNALS:  # a second signal must not interrupt the stopping
            signal.signal(handled, signal.SIG_IGN)
        raise StopRequested(signum)
