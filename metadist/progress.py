"""Progress of long work: a rich bar on a terminal, else a line every few seconds.

One display (`Progress`) holds one or more counters (`Progress.counter`): the passes of
an ingest in rows, the tasks of an evaluation, the rows of a synthetic panel. On a
terminal each counter is a rich bar; elsewhere (batch logs, `nohup`, Slurm `.out`) each
prints one line every `every` seconds when `lines` is on, so long work is never silent,
and short work prints nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

# Seconds between two progress lines when the stream is not a terminal.
LINE_EVERY_S = 15.0


class Progress:
    """A progress display (`with Progress(...) as shown: c = shown.counter(...)`).

    Args:
        enabled: `True` shows progress, `False` nothing, `None` shows it on a terminal
            (and, with `lines`, as lines elsewhere).
        every: seconds between two lines off a terminal (default `LINE_EVERY_S`); the
            first line comes after `every` seconds.
        stream: where progress goes (default stderr).
        lines: print periodic lines when the stream is not a terminal; without them,
            `enabled=True` draws the bars there too.
        transient: remove the bars when the display closes (lines already printed stay).
        clock: seconds since an arbitrary origin (default `time.perf_counter`; tests pass
            a fake one).
    """

    def __init__(
        self,
        enabled: bool | None = None,
        every: float | None = None,
        stream: TextIO | None = None,
        lines: bool = True,
        transient: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clock = clock
        self.stream = stream if stream is not None else sys.stderr
        terminal = isatty(self.stream)
        # off a terminal: lines where the work has them, else a bar only when asked for
        self.bars = enabled is not False and (terminal or (enabled is True and not lines))
        self.lines = enabled is not False and not terminal and lines
        self.every = LINE_EVERY_S if every is None else every
        self.transient = transient
        self._rich: Any = None

    def __enter__(self) -> Progress:
        if self.bars:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            self._rich = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[unit]}"),
                TextColumn("{task.fields[rate]}", justify="right"),
                TextColumn("{task.fields[note]}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[left]}"),
                console=Console(file=self.stream),
                transient=self.transient,
            )
            self._rich.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Removes or freezes the bars (as `transient` says)."""
        if self._rich is not None:
            self._rich.__exit__(None, None, None)
            self._rich = None

    def counter(
        self, label: str, total: int | None, unit: str = "", rate: bool = False, start: int = 0
    ) -> Counter:
        """A new counter of `total` (`None`: unknown) `unit`s, shown as `label`, `start`
        of them done already (a resumed run); `rate` adds units per second."""
        return Counter(self, label, total, unit, rate, start)

    def print(self, text: str) -> None:
        """A line for the person watching, above the bars."""
        if self._rich is not None:
            self._rich.console.print(text)
        else:
            print(text, file=self.stream, flush=True)


class Counter:
    """One counter of a `Progress` display (`advance(n)` or `update(done)`).

    Its time-left estimate is measured from the first progress on, not from the start:
    the first unit (or chunk) of most work is a warm-up (a compile, the first batch's
    allocations, a phase before the counted one) many times slower than the rest, and a
    rate that includes it overstates what is left many times over. Until a unit after the
    first has finished there is no estimate (`estimating time left`).
    """

    def __init__(
        self,
        display: Progress,
        label: str,
        total: int | None,
        unit: str,
        rate: bool,
        start: int = 0,
    ) -> None:
        self.display, self.label, self.total, self.unit = display, label, total, unit
        self.rate = rate
        self.done = self.start = start
        self.note = ""
        self.started = self._last_line = display.clock()
        # (time, done) when the first progress was recorded: the rate's origin
        self._first: tuple[float, int] | None = None
        self._task = None
        if display._rich is not None:
            self._task = display._rich.add_task(
                label, total=total, completed=start, unit=unit, rate="", note="", left=""
            )

    def advance(self, amount: int) -> None:
        """Records `amount` more units done."""
        self.update(self.done + amount)

    def update(self, done: int, note: str | None = None) -> None:
        """Records that `done` units are done so far; `note` (e.g. the current loss) is
        shown with them."""
        self.done = done
        if note is not None:
            self.note = note
        now = self.display.clock()
        if self._first is None and done > self.start:
            self._first = (now, done)
        rich = self.display._rich
        if rich is not None and self._task is not None:
            speed = (done - self.start) / max(now - self.started, 1e-9)
            shown = f"{speed:,.0f} {self.unit}/s" if self.rate else ""
            left = self.seconds_left(now)
            estimate = "" if left is None else f"~{left:.0f} s left"
            rich.update(self._task, completed=done, rate=shown, note=self.note, left=estimate)
            return
        if self.display.lines and now - self._last_line >= self.display.every:
            self._last_line = now
            print(self.line(now - self.started), file=self.display.stream, flush=True)

    def line(self, elapsed: float) -> str:
        """The one-line report after `elapsed` seconds."""
        progressed = self.done - self.start
        speed = f", {progressed / max(elapsed, 1e-9):,.0f} {self.unit}/s" if self.rate else ""
        note = f", {self.note}" if self.note else ""
        if not self.total:
            return f"{self.label}: {self.done} {self.unit}, {elapsed:.0f} s{speed}{note}"
        left = self.seconds_left(self.started + elapsed)
        estimate = "estimating time left" if left is None else f"about {left:.0f} s left"
        return (
            f"{self.label}: {self.done}/{self.total} {self.unit} "
            f"({100 * self.done / self.total:.0f}%), {elapsed:.0f} s, {estimate}{speed}{note}"
        )

    def seconds_left(self, now: float) -> float | None:
        """Seconds left at clock time `now` at the rate since the first progress, or
        `None` while no unit after the first recorded progress has finished (or the total
        is unknown); 0 once the total is done, however it got there."""
        if self.total and self.done >= self.total:
            return 0.0
        if not self.total or self._first is None:
            return None
        first_at, first_done = self._first
        if self.done <= first_done or now <= first_at:
            return None
        rate = (self.done - first_done) / (now - first_at)
        return max(self.total - self.done, 0) / rate


def isatty(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (False for streams that cannot say)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
