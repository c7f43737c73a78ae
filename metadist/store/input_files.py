"""Which files `metadist ingest` reads: SRC as a file, a directory or a glob pattern."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path

from metadist.store.format import is_store

_GLOB_CHARS = set("*?[")
# what pyarrow, pandas, Spark and Dask name their files (any case), and others' names
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
_MAGIC = b"PAR1"  # a Parquet file's first bytes (Hive writes `000000_0`, no suffix)


def resolve_paths(src: str | Path, exclude: Path | None = None) -> list[Path]:
    """Parquet files named by `src`: a file, a directory (its Parquet files, searched
    recursively), or a glob pattern (its files, and the Parquet files of the directories
    it matches, as Spark and Dask write `data.parquet/part-0.parquet`).

    Below a directory, a Parquet file is one named `*.parquet`, `*.pq` or `*.parq` (any
    case), or one without a suffix whose first bytes are Parquet's (`PAR1`: Hive's
    `000000_0`);
    other files (a README), names starting with `.` or `_` (`_SUCCESS`, `_metadata`) and
    series stores are skipped.

    Args:
        src: the input.
        exclude: a directory whose files are never input (the store being written, when
            it lies inside `src`).

    Raises:
        FileNotFoundError: nothing matches.
        ValueError: `src` or a directory below it cannot be read (permissions), or a
            directory holds no Parquet file.
    """
    text = str(src)
    path = Path(text)
    try:
        path.stat()
    except PermissionError:
        raise ValueError(f"cannot read the input {text!r}: permission denied") from None
    except OSError:
        pass  # missing or a glob pattern: told apart below ("does not exist" or matches)
    skipped = exclude.resolve() if exclude is not None else None
    if path.is_file():
        return [path]
    if path.is_dir():
        return _parquet_files(path, skipped)
    if _GLOB_CHARS & set(text):
        files: list[Path] = []
        for match in sorted(Path(p) for p in glob.glob(text, recursive=True)):
            if _inside(match, skipped):
                continue
            if match.is_file():
                files.append(match)
            elif match.is_dir() and not _is_store(match):
                files += _parquet_files(match, skipped)
        if not files:
            raise FileNotFoundError(f"no files match the pattern {text!r}")
        return sorted(dict.fromkeys(files))
    raise FileNotFoundError(f"input {text!r} does not exist")


def _parquet_files(directory: Path, skipped: Path | None) -> list[Path]:
    """The Parquet files below `directory` (`_walk`), in order.

    Raises:
        ValueError: there are none.
    """
    files = sorted(_walk(directory, skipped))
    if not files:
        raise ValueError(
            f"empty input: directory {directory} holds no Parquet files (named *.parquet, "
            "*.pq or *.parq, or without a suffix and starting with Parquet's bytes; other "
            "files, names starting "
            "with . or _, and series stores are skipped)"
        )
    return files


def _walk(root: Path, skipped: Path | None) -> Iterator[Path]:
    """Parquet files below `root` (`_is_parquet`), skipping hidden (`.`) and private
    (`_`) names, series stores and `skipped`."""

    def refuse(error: OSError) -> None:
        raise ValueError(
            f"cannot read directory {error.filename} of the input {root}: "
            f"{error.strerror.lower() if error.strerror else error}"
        )

    for directory, subdirectories, names in os.walk(root, onerror=refuse):
        here = Path(directory)
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if not name.startswith((".", "_"))
            and not _inside(here / name, skipped)
            and not _is_store(here / name)
        )
        for name in names:
            candidate = here / name
            if not name.startswith((".", "_")) and candidate.is_file() and _is_parquet(candidate):
                yield candidate


def _is_parquet(path: Path) -> bool:
    """Named as Parquet (any case), or, without any suffix (Hive's `000000_0`), starting
    with its bytes; one of those that cannot be read is taken, so that its reader names
    it. Other names (`part-0.parquet.bak`, a README) are not input."""
    if path.name.lower().endswith(PARQUET_SUFFIXES):
        return True
    if "." in path.name:
        return False
    try:
        with open(path, "rb") as file:
            return file.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return True


def _is_store(path: Path) -> bool:
    """Whether `path` is a series store; one that cannot be read is walked (and its
    reader names the directory)."""
    try:
        return is_store(path)
    except OSError:
        return False


def _inside(path: Path, directory: Path | None) -> bool:
    if directory is None:
        return False
    resolved = path.resolve()
    return resolved == directory or directory in resolved.parents
