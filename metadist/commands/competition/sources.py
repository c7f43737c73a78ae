"""Which training file an output was made from: a store or a validation split is reused
only while that file is unchanged (the fingerprint `metadist ingest` records)."""

from __future__ import annotations

import json
from pathlib import Path

from metadist.store.sources import SourceFile, fingerprint


def file_fingerprint(path: Path) -> str:
    """The fingerprint `metadist ingest` records of an input file (its resolved path,
    size and modification time)."""
    stat = path.stat()
    return fingerprint([SourceFile(path, 0, stat.st_size, stat.st_mtime_ns)])


def recorded_fingerprint(path: Path, key: str | None = None) -> str | None:
    """The `fingerprint` of a JSON file (under `key`), None where there is none."""
    try:
        document = json.loads(path.read_text())
        return str((document[key] if key else document)["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_same_source(made: Path, recorded: str | None, source: Path, out: Path) -> None:
    """Refuses to reuse `made` (a store, a validation split) if `source` is not the file
    it was made from: it changed or moved since, and what was built on it is stale.

    Raises:
        ValueError: naming both and what to do.
    """
    if recorded is None:
        raise ValueError(
            f"{made} does not record which file it was made from (an earlier version made "
            f"it), so it may be stale: give another --out, or remove {out}"
        )
    if recorded != file_fingerprint(source):
        raise ValueError(
            f"{made} was not made from {source} as it is now (the file changed or moved "
            f"since); its models and tables would be of the old data: give another --out, "
            f"or remove {out}"
        )
