"""Baselines shared by every run evaluated on this machine: a run's first evaluation reuses
what another run's evaluation computed on the same store and episodes.

No baseline depends on a run's meta-trained weights (`metadist.eval.cache`), and each
entry's key already holds everything that determines it: the inputs' bytes (the episodes'
support and query tensors, a series' history), the initial weights of the network, the
settings, the device and the library versions. So the from-scratch predictions, the
statistical forecasts, the pretrained embedding and Baseline++ of one run's evaluation are
those of any other run of the same architecture evaluated on the same store, split and
episodes (seeds and learners compared side by side): `SharedCache` keeps them where every
evaluation finds them.

Where: `$METADIST_CACHE/eval/` (default `$XDG_CACHE_HOME/metadist/eval`, else
`~/.cache/metadist/eval`), never in a store or run directory. Under it, one directory
per version of the code (`code_fingerprint`: a SHA-256 of metadist's source files, so an
edited or upgraded metadist never reads what another version computed), holding

- `packs/<sha256>.npz`: the entries one evaluation computed, packed as the run's
  `baselines.npz` is, its index naming the keys it holds;
- `pretrained/<key>.pt`: one pretrained embedding's weights.

Every file is written to a temporary name and renamed into place (`durable.atomic_file`),
and its name is its content's key, so concurrent evaluations never see half a file, and
two that compute the same entry write the same bytes. A file that cannot be read is
ignored (and recomputed), never trusted. The cache is bounded: after a write, the least
recently used files go until it holds at most `$METADIST_CACHE_MAX_MB` (default 2048) MB.
`metadist eval --no-shared-cache` (or `evaluate_run(shared_cache=False)`) neither reads
nor writes it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from metadist.durable import atomic_file
from metadist.eval.packing import pack, read_index, unpack

CACHE_ENV = "METADIST_CACHE"
MAX_MB_ENV = "METADIST_CACHE_MAX_MB"
DEFAULT_MAX_MB = 2048
_PACKS = "packs"
_PRETRAINED = "pretrained"


def shared_cache_root() -> Path:
    """`$METADIST_CACHE/eval`, else `$XDG_CACHE_HOME/metadist/eval`, else
    `~/.cache/metadist/eval`."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser() / "eval"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "metadist" / "eval"


@cache
def code_fingerprint() -> str:
    """SHA-256 (hex, 16 digits) of the source of every module of the metadist package
    this process imports (their paths and bytes, in order)."""
    package = Path(__file__).resolve().parent.parent  # metadist/
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode())
        h.update(b"\x00")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def max_bytes() -> int:
    """The bound on the cache's size (`$METADIST_CACHE_MAX_MB`, default 2048 MB).

    Raises:
        ValueError: the variable is not a non-negative number.
    """
    value = os.environ.get(MAX_MB_ENV, "")
    try:
        megabytes = float(value) if value else DEFAULT_MAX_MB
    except ValueError:
        megabytes = -1.0
    if not megabytes >= 0:
        raise ValueError(f"{MAX_MB_ENV} must be a number of megabytes >= 0, got {value!r}")
    return int(megabytes * 1024 * 1024)


class SharedCache:
    """The baselines shared between runs (see the module docstring).

    Args:
        root: the cache's directory (default `shared_cache_root()`); entries live in its
            subdirectory of this code's `code_fingerprint`.
        limit: its bound in bytes (default `max_bytes()`).
    """

    def __init__(self, root: str | Path | None = None, limit: int | None = None) -> None:
        self.root = Path(root) if root is not None else shared_cache_root()
        self.directory = self.root / code_fingerprint()
        self.limit = max_bytes() if limit is None else int(limit)
        self._index: dict[str, Path] | None = None
        self._loaded: dict[Path, dict[str, Any]] = {}

    def get(self, key: str) -> Any:
        """The entry of `key` some evaluation kept (an array, or a dict of arrays), or None."""
        path = self._keys().get(key)
        if path is None:
            return None
        if path not in self._loaded:
            try:
                self._loaded[path] = unpack(path)
                os.utime(path)  # recently used: the last to go when the cache is trimmed
            except Exception as error:  # evicted meanwhile, or damaged: recomputed
                _skip(path, error)
                self._loaded[path] = {}
        return self._loaded[path].get(key)

    def has(self, key: str) -> bool:
        """Whether a pack holds `key`."""
        return key in self._keys()

    def has_pretrained(self, key: str) -> bool:
        """Whether the pretrained embedding of `key` is kept."""
        return (self.directory / _PRETRAINED / f"{key}.pt").is_file()

    def put_all(self, entries: dict[str, Any]) -> None:
        """Keeps `entries` (`{key: array or dict of arrays}`) as one pack."""
        if not entries:
            return
        name = hashlib.sha256("\x00".join(sorted(entries)).encode()).hexdigest()
        path = self.directory / _PACKS / f"{name}.npz"

        def write(temporary: Path) -> None:
            with open(temporary, "wb") as out:
                np.savez(out, **pack(entries))

        self._write(path, write)
        if self._index is not None:
            self._index.update(dict.fromkeys(entries, path))

    def load_pretrained(self, key: str) -> dict[str, Any] | None:
        """The payload `save_pretrained` kept under `key`, or None."""
        path = self.directory / _PRETRAINED / f"{key}.pt"
        if not path.is_file():
            return None
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            os.utime(path)
        except Exception as error:
            _skip(path, error)
            return None
        return saved if isinstance(saved, dict) and saved.get("key") == key else None

    def save_pretrained(self, key: str, payload: dict[str, Any]) -> None:
        """Keeps `payload` (with its `key`: see `EvalCache.save_pretrained`)."""
        path = self.directory / _PRETRAINED / f"{key}.pt"
        self._write(path, lambda temporary: torch.save(payload, temporary))

    def trim(self) -> None:
        """Removes the least recently used files (of any code version) until the cache
        holds at most `limit` bytes."""
        files = []
        for path in self.root.glob("*/*/*"):
            try:
                info = path.stat()
            except OSError:  # removed by another evaluation meanwhile
                continue
            if path.is_file() and not path.name.startswith("."):
                files.append((info.st_mtime, info.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda item: item[0]):
            if total <= self.limit:
                break
            path.unlink(missing_ok=True)
            total -= size

    def _keys(self) -> dict[str, Path]:
        """`{key: the pack holding it}` of every pack (read once: each pack's index)."""
        if self._index is None:
            self._index = {}
            packs = self.directory / _PACKS
            for path in sorted(packs.glob("*.npz")) if packs.is_dir() else []:
                try:
                    self._index.update(dict.fromkeys(read_index(path), path))
                except Exception as error:
                    _skip(path, error)
        return self._index

    def _write(self, path: Path, write: Any) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, durable=False) as temporary:
                write(temporary)
            self.trim()
        except OSError as error:
            print(
                f"warning: could not keep baselines in the shared cache {path}: {error}",
                file=sys.stderr,
            )


def _skip(path: Path, error: Exception) -> None:
    if not isinstance(error, FileNotFoundError):
        print(f"warning: ignoring {path} ({type(error).__name__}: {error})", file=sys.stderr)
