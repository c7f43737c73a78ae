"""An ingest's progress in rows per pass, shown through `metadist.progress`.

The passes call `bar.add(name, total)` once and `bar.advance(task, rows)` as they go; on a
terminal each pass is a bar with its rate, elsewhere (a batch job's log, `nohup`) a line
every `metadist.progress.LINE_EVERY_S` seconds, so a long ingest is never silent (a short
one prints none).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from metadist.progress import Counter, Progress

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


class _ShownBar(Bar):
    def __init__(self, display: Progress) -> None:
        self.display = display

    def add(self, name: str, total: int) -> Counter:
        return self.display.counter(_LABELS[name], total, "rows", rate=True)

    def advance(self, task: Any, num_rows: int) -> None:
        task.advance(num_rows)


@contextmanager
def progress_bar(enabled: bool | None) -> Iterator[Bar]:
    """A `Bar` drawing on stderr if `enabled`; for None, drawing if stderr is a terminal,
    else printing a line now and then."""
    with Progress(enabled, lines=enabled is None) as display:
        yield _ShownBar(display) if display.bars or display.lines else Bar()
