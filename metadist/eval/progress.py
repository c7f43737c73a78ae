"""What an evaluation shows while it runs, and how many threads it uses.

`TaskProgress` counts evaluated tasks: a rich bar on a terminal, else one line on stderr
every `every` seconds (logs of batch jobs), so a long evaluation is never silent.
`eval_threads` runs evaluation on one intra-op thread unless `OMP_NUM_THREADS` is set:
the models are small, so the per-op thread hand-off costs more than it saves (measured
in the README's Evaluation section).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import torch

# Seconds between two progress lines when stderr is not a terminal.
LINE_EVERY_S = 15.0


class TaskProgress:
    """Counts evaluated tasks out of `total` (`start`, `update`, `close`, or `with`).

    Args:
        total: tasks expected (`None` if unknown: the count is shown without a bar).
        enabled: `True` shows progress, `False` nothing, `None` shows it too (a rich bar
            when `stream` is a terminal, else periodic lines).
        every: seconds between two lines when `stream` is not a terminal (default
            `LINE_EVERY_S`); the first line comes after `every` seconds, so short
            evaluations print nothing.
        stream: where progress goes (default stderr).
    """

    def __init__(
        self,
        total: int | None,
        enabled: bool | None = None,
        every: float | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.total = total
        self.enabled = enabled is not False
        self.every = LINE_EVERY_S if every is None else every
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._started = 0.0
        self._last_line = 0.0
        self._rich: Any = None
        self._task: Any = None

    def __enter__(self) -> TaskProgress:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Starts the clock (and the bar on a terminal)."""
        self._started = self._last_line = time.perf_counter()
        if self.enabled and _isatty(self.stream):
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._rich = Progress(
                TextColumn("evaluating"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("tasks"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._rich.__enter__()
            self._task = self._rich.add_task("evaluating", total=self.total)

    def update(self, done: int) -> None:
        """Records that `done` tasks have been scored so far."""
        self.done = done
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, completed=done)
            return
        now = time.perf_counter()
        if now - self._last_line >= self.every:
            self._last_line = now
            print(self.line(now - self._started), file=self.stream, flush=True)

    def line(self, elapsed: float) -> str:
        """The one-line progress report after `elapsed` seconds."""
        if not self.total:
            return f"evaluating: {self.done} tasks, {elapsed:.0f} s"
        left = elapsed * (self.total - self.done) / max(self.done, 1)
        return (
            f"evaluating: {self.done}/{self.total} tasks "
            f"({100 * self.done / self.total:.0f}%), {elapsed:.0f} s, about {left:.0f} s left"
        )

    def close(self) -> None:
        """Removes the bar (lines already printed stay)."""
        if self._rich is not None:
            self._rich.__exit__(None, None, None)
            self._rich = None


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def eval_threads() -> Iterator[int]:
    """Runs the block on one intra-op thread unless `OMP_NUM_THREADS` is set.

    Yields the thread count in use; the previous count is restored afterwards.
    """
    before = torch.get_num_threads()
    if os.environ.get("OMP_NUM_THREADS"):
        yield before
        return
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(before)
