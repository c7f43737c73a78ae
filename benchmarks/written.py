"""A benchmark's results file appears whole or not at all.

The scripts write their tables and measurements at the end of a run that may have taken
an hour; a run stopped or failed while writing must leave the file of the previous run
as it was, never a truncated one. `write_results` writes through `metadist.durable` (a
temporary sibling renamed over the file), making the file's directory first.
"""

from __future__ import annotations

from pathlib import Path

from metadist.durable import atomic_write_text


def write_results(path: Path, text: str) -> None:
    """Writes `text` to `path` whole or not at all, making its directory if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
