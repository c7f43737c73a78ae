"""SIGTERM and SIGHUP raised as an exception inside a block, so that its `finally`
blocks run (a store's temporary directory removed) instead of the process vanishing.

Python's default for SIGTERM and SIGHUP ends the process at once: no `finally` runs, and
whatever was being written stays behind. Inside `stops_raised()` those of the two whose
handler is still the default raise `Stopped`, a `SystemExit` whose status is the one a
shell reports for a process killed by the signal (128 + its number): the clean-up runs,
no `except Exception` swallows it, and left uncaught it ends the process quietly with
that status. A handler that the program set itself is left alone, and so is every
thread but the main one (signals reach only the main thread).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(SystemExit):
    """A stop signal reached the process inside `stops_raised` (`name`: `"SIGTERM"`)."""

    def __init__(self, signum: int, written: bool = False) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.written = written  # it came while the output was put in place (`stops_held`)

    def line(self, command: str, what: str, out: object) -> str:
        """The one line `metadist COMMAND` prints when stopped while writing `what` (a
        store) at `out`."""
        if self.written:
            return (
                f"metadist {command}: stopped by {self.name} as the {what} at {out} was put "
                f"in place: the new {what} is there, complete"
            )
        return (
            f"metadist {command}: stopped by {self.name}: no {what} was written at {out} "
            "(what was there is unchanged) and the temporary files are removed"
        )


@contextlib.contextmanager
def handlers_set(
    handler: Callable[[int, FrameType | None], Any], signums: Iterable[int]
) -> Iterator[None]:
    """Sets `handler` for `signums` inside the block and puts the previous handlers back
    when it is left; in any thread but the main one, sets nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, earlier in previous.items():
            signal.signal(signum, earlier)


@contextlib.contextmanager
def stops_raised() -> Iterator[None]:
    """Inside the block, SIGTERM and SIGHUP (where their handler is the default) raise
    `Stopped`; once one has, both are ignored until the block is left, so that a second
    signal does not interrupt the clean-up."""
    taken = [signum for signum in STOP_SIGNALS if signal.getsignal(signum) == signal.SIG_DFL]

    def stop(signum: int, frame: FrameType | None) -> None:
        for other in taken:
            signal.signal(other, signal.SIG_IGN)
        raise Stopped(signum)

    stop.raises_stopped = True  # type: ignore[attr-defined]  # found by `stops_held`
    with handlers_set(stop, taken):
        yield


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Inside `stops_raised`, a step that must not be cut (an output put in place): a
    SIGTERM or SIGHUP that arrives in the block is held, and raises `Stopped` (`written`)
    once the block has finished; where the block fails, its error goes on and the signal
    is dropped. Signals `stops_raised` did not take are left alone."""
    ours = [s for s in STOP_SIGNALS if getattr(signal.getsignal(s), "raises_stopped", False)]
    received: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    with handlers_set(hold, ours):
        yield
    if received:
        for signum in ours:
            signal.signal(signum, signal.SIG_IGN)  # as `stops_raised` does: the clean-up
        raise Stopped(received[0], written=True)
