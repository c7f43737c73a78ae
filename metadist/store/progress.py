"""Progress of an ingest in rows per pass: a rich bar on a terminal, or nothing."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LABELS = {
    "scan": "pass 1 scan",
    "write": "pass 2 write",
    "order": "pass 3 order",
    "finish": "pass 2 scale in place",  # input already in store order: the last pass
}


class Bar:
    """Counts rows per pass; this base class shows nothing."""

    def add(self, name: str, total: int) -> Any:
        """Starts pass `name` ("scan", "write", "order" or "finish") of `total` rows."""
        return None

    def advance(self, task: Any, num_rows: int) -> None:
        """Records `num_rows` more rows done in `task`."""


class _RichBar(Bar):
    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def add(self, name: str, total: int) -> Any:
        return self.progress.add_task(_LABELS[name], total=total, rate="")

    def advance(self, task: Any, num_rows: int) -> None:
        self.progress.advance(task, num_rows)
        speed = self.progress.tasks[task].speed
        if speed:
            self.progress.update(task, rate=f"{speed:,.0f} rows/s")


@contextmanager
def progress_bar(enabled: bool | None) -> Iterator[Bar]:
    """A `Bar` drawing on stderr if `enabled`, or (for None) if stderr is a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield Bar()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows"),
        TextColumn("{task.fields[rate]}", justify="right"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with progress:
        yield _RichBar(progress)
