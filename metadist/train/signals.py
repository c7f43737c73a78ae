"""Turning SIGTERM, SIGUSR1 and SIGINT (Ctrl-C) into "checkpoint, then exit cleanly".

Schedulers stop jobs with SIGTERM, and Slurm sends SIGUSR1 (`--signal=USR1@120`) some time
before a preemption or the time limit. The handler only records the signal; the training
loop looks at it between meta-steps, and the ranks agree on it through the per-step
all-reduce, so that every rank stops after the same step and the checkpoint is consistent.
A second SIGINT while the first is pending aborts at once (`SecondInterrupt`, a
`KeyboardInterrupt`), without a checkpoint, unless it comes within `REPEAT_S` of the first: that is the same Ctrl-C
delivered twice (a terminal sends it to every process of its group while the parent
command, or GNU `timeout`, passes it on as well), not a user pressing it again.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# a SIGINT this soon after the first stop signal is the same one delivered twice (s)
REPEAT_S = 1.0


class SecondInterrupt(KeyboardInterrupt):
    """A second Ctrl-C while a stop was pending: the run aborts at once, without a
    checkpoint of this stop (a plain `KeyboardInterrupt` is a first Ctrl-C outside the
    meta-steps, where no `StopRequest` catches it)."""


class StopRequest:
    """Context manager that catches the stop signals while training runs.

    Attributes:
        signal_name: the name of the first signal received (`"SIGTERM"`), or `None`.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.signal_name: str | None = None
        self._first_at = 0.0  # time.monotonic() of the first stop signal
        self._previous: dict[signal.Signals, Any] = {}  # the handlers signal.signal returned

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            self._first_at = time.monotonic()
            if signum == signal.SIGINT and "LOCAL_RANK" not in os.environ:  # a terminal's
                print(
                    f"SIGINT: stopping after this meta-step, with a checkpoint (Ctrl-C again "
                    f"after {REPEAT_S:g} s aborts at once, without one)",
                    file=sys.stderr,
                    flush=True,
                )
        elif signum == signal.SIGINT and time.monotonic() - self._first_at > REPEAT_S:
            raise SecondInterrupt

    def __enter__(self) -> StopRequest:
        # Handlers can only be installed from the main thread; elsewhere (a test calling
        # train() from a thread) stop signals keep their default behaviour.
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
