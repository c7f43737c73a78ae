"""On-disk layout of a series store, and the small file helpers that write it durably.

A store is a directory:

- `values.bin`: little-endian float32 `[num_rows, num_columns]`, entity-major (all rows
  of entity 0 sorted by time, then entity 1, ...). Columns are the features, then the
  targets that are not already features.
- `times.bin`: int64 `[num_rows]`, the time of each row (integers as given, timestamps
  as nanoseconds since the epoch).
- `index.arrow`: Arrow IPC file, one row per entity: `entity_id` (string), `start`
  (int64 row offset), `length` (int64), `stratum` (string), `label` (string).
- `entity_stats.npz`: per-entity moments of each column before scaling, `[E, C]` arrays
  `count`, `mean`, `m2` and `std` (the scale that per-entity scaling divides by).
- `metadata.json`: format name and version, column names, scaling kind and global
  statistics, source fingerprint, checksums, per-stratum counts, dropped entities, and
  `metadata_checksum`: the checksum of its own other fields (`metadata_checksum`).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_NAME = "metadist-series-store"
FORMAT_VERSION = 1

VALUES_FILE = "values.bin"
TIMES_FILE = "times.bin"
INDEX_FILE = "index.arrow"
ENTITY_STATS_FILE = "entity_stats.npz"
METADATA_FILE = "metadata.json"
STORE_FILES = (VALUES_FILE, TIMES_FILE, INDEX_FILE, ENTITY_STATS_FILE, METADATA_FILE)

VALUES_DTYPE = np.dtype("<f4")
TIMES_DTYPE = np.dtype("<i8")
INDEX_COLUMNS = ("entity_id", "start", "length", "stratum", "label")
CHECKSUM_ALGORITHM = "crc32"
SCALING_KINDS = ("global", "per-entity", "none")

_HASH_CHUNK_BYTES = 16 << 20


class Checksum:
    """Streaming CRC-32 of a file's bytes (zlib; several GB/s, enough to detect damage)."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Any) -> None:
        """Adds the bytes of `data` (bytes or a C-contiguous array)."""
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def file_checksum(
    path: Path,
    chunk_bytes: int = _HASH_CHUNK_BYTES,
    read: Callable[[int], None] | None = None,
) -> str:
    """Hex checksum of a whole file, read in bounded chunks (`read` is told the bytes of
    each, for progress)."""
    checksum = Checksum()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            checksum.update(chunk)
            if read is not None:
                read(len(chunk))
    return checksum.hexdigest()


METADATA_CHECKSUM = "metadata_checksum"


def metadata_checksum(metadata: dict[str, Any]) -> str:
    """Hex CRC-32 of every field of `metadata` but `metadata_checksum` itself, as compact
    JSON with sorted keys: the same for the dict written and the one read back, so that
    `metadist verify` finds a changed digit (a scale, a kind) that still parses."""
    fields = {key: value for key, value in metadata.items() if key != METADATA_CHECKSUM}
    checksum = Checksum()
    checksum.update(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())
    return checksum.hexdigest()


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Writes `payload` as indented JSON and fsyncs it."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_metadata(path: Path) -> dict[str, Any]:
    """Reads and checks `metadata.json` of the store directory `path`.

    Raises:
        FileNotFoundError: `path` is not a directory or has no `metadata.json`.
        ValueError: the file is not valid JSON, not a metadist store, or of another
            format version.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no series store at {path}: the path does not exist")
    if not path.is_dir():
        raise ValueError(f"{path} is not a series store: it is a file, not a directory")
    meta_path = path / METADATA_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{path} is not a series store: {METADATA_FILE} is missing "
            "(create one with `metadist ingest`)"
        )
    try:
        metadata = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{meta_path} is not valid JSON: {error}") from error
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        raise ValueError(f"{path} is not a series store: {meta_path} has no format {FORMAT_NAME!r}")
    version = metadata.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path} has store format version {version!r}; this metadist reads version "
            f"{FORMAT_VERSION} (re-create the store with `metadist ingest`)"
        )
    required = (
        "column_names",
        "feature_names",
        "target_names",
        "num_rows",
        "num_entities",
        "scaling",
        "time_kind",
    )
    missing = [key for key in required if key not in metadata]
    if missing:
        raise ValueError(f"{meta_path} lacks the fields {missing}; the store is damaged")
    return metadata


def is_store(path: Path) -> bool:
    """Whether `path` is a directory holding a metadist store's metadata."""
    try:
        read_metadata(path)
    except (FileNotFoundError, ValueError):
        return False
    return True


def check_given_store(path: str | os.PathLike) -> None:
    """Refuses a store a user gave for a run (`store=PATH`, `--store PATH`) where no
    series store is.

    Raises:
        FileNotFoundError: naming `path` as the store given (the run's config was blamed).
        ValueError: a store there that cannot be read (another format version, damaged
            metadata), with the reason.
    """
    try:
        read_metadata(Path(path))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"store {path} (store=PATH, --store PATH): no series store there; give the "
            "directory `metadist ingest` wrote for the run's data"
        ) from None
    except ValueError as error:  # a store, but not one this version reads (it says why)
        raise ValueError(f"store {path} (store=PATH, --store PATH): {error}") from None
