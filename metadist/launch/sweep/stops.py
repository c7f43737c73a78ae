"""Stop signals reaching a sweep's driver: Ctrl-C raises `KeyboardInterrupt`, SIGTERM and
SIGHUP raise `StopRequested` (`launch.children`), so that either way the driver stops its
running trials and queues them again; and all three are held back while trials are
being started or queued again, so that none is left untracked or half-queued."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

from metadist.launch.children import STOP_SIGNALS, StopRequested
from metadist.stop_signals import handlers_set


@contextlib.contextmanager
def stops_raised() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP raise `StopRequested` (main thread only;
    SIGINT keeps its `KeyboardInterrupt`)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise StopRequested(signum)

    with handlers_set(stop, [s for s in STOP_SIGNALS if s != signal.SIGINT]):
        yield


@contextlib.contextmanager
def stops_deferred(deliver: bool = True) -> Iterator[None]:
    """Holds SIGINT, SIGTERM and SIGHUP back inside the block and delivers the first one
    received after it (main thread only); with `deliver` false, drops them (the driver
    is stopping already)."""
    received: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    with handlers_set(hold, STOP_SIGNALS):
        yield
    if received and deliver:
        signal.raise_signal(received[0])
