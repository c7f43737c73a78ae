"""What an evaluation keeps for the next evaluation of the same run: its baselines.

No baseline depends on the meta-trained weights: the pretrained embedding is trained on the
run's meta-train classes, the from-scratch network and the statistical forecasts on each
task's own data. `EvalCache(run_dir / "eval")` keeps them, so that evaluating the run again
(`metadist eval` after training's own evaluation, with other `eval.inner_steps`, or a later
checkpoint) computes only the meta-trained model's predictions:

- `pretrained_embedding.pt`: the pretrained backbone's weights, with the key of what it
  was trained from (`load_pretrained` / `save_pretrained`);
- `baselines.npz`: from-scratch predictions and Baseline++ scores per batch, statistical
  forecasts per series (`get` / `put`), written by `save` after the report, holding the entries the latest
  evaluation used (so it does not grow with every setting tried).

Every entry is keyed by a SHA-256 `digest` of everything that determines it: the inputs'
bytes (support and query tensors, a series' history), the settings, the code's version
(`CACHE_VERSION`, metadist's, torch's and numpy's) and, for networks, the initial weights
and the device. A changed input or setting gives another key, so a stale entry is never
used. The report says what was reused (`summary`). A cache that cannot be written costs the
next evaluation time, nothing else: a warning, and the evaluation goes on.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from metadist import __version__
from metadist.durable import atomic_file

# Bumped whenever a cached baseline would be computed differently.
CACHE_VERSION = 1
PREDICTIONS_FILE = "baselines.npz"
PRETRAINED_FILE = "pretrained_embedding.pt"
_FORMAT = "metadist.eval-cache/1"
_VERSIONS = (__version__, torch.__version__, np.__version__)


def digest(*parts: Any) -> str:
    """SHA-256 (hex) of `parts`: arrays and tensors by dtype, shape and bytes, anything
    else by its JSON (`str` for what JSON cannot write), with the code's versions."""
    h = hashlib.sha256(repr(_VERSIONS).encode())
    for part in parts:
        if isinstance(part, torch.Tensor):
            part = part.detach().to("cpu")
            part = (part.float() if part.dtype == torch.bfloat16 else part).numpy()
        if isinstance(part, np.ndarray):
            h.update(f"{part.dtype}{part.shape}".encode())
            h.update(np.ascontiguousarray(part).tobytes())
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()


def model_digest(model: nn.Module) -> str:
    """What a network computes from its weights: its class, options, structure and
    weights."""
    state = [(name, tensor) for name, tensor in model.state_dict().items()]
    return digest(
        type(model).__qualname__,
        repr(getattr(model, "options", None)),
        repr(model),
        *[item for pair in state for item in pair],
    )


class EvalCache:
    """The baselines of a run's evaluations (see the module docstring).

    Args:
        directory: the run's `eval/` directory; `None` keeps nothing (every `get` misses).
    """

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = None if directory is None else Path(directory)
        self._stored: dict[str, Any] | None = None
        self._used: dict[str, Any] = {}
        self.reused: Counter[str] = Counter()
        self.computed: Counter[str] = Counter()

    def get(self, kind: str, key: str) -> Any:
        """The entry of `key` (an array, or a dict of arrays), or `None`; counted as reused
        under `kind`."""
        found = self._entries().get(key)
        if found is not None:
            self._used[key] = found
            self.reused[kind] += 1
        return found

    def put(self, kind: str, key: str, value: Any) -> None:
        """Keeps `value` (a tensor or array, or a dict of them) under `key`; counted as
        computed under `kind`."""
        self._used[key] = _as_arrays(value)
        self.computed[kind] += 1

    def load_pretrained(self, key: str, backbone: nn.Module) -> bool:
        """Loads the pretrained weights of `key` into `backbone`; False when none are kept
        (or they were trained from something else)."""
        path = self._path(PRETRAINED_FILE)
        if path is None or not path.is_file():
            return False
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # a damaged file is recomputed, never trusted
            _warn(f"ignoring {path} ({type(error).__name__}: {error})")
            return False
        if not isinstance(saved, dict) or saved.get("format") != _FORMAT:
            return False
        if saved.get("key") != key:
            return False
        backbone.load_state_dict(saved["state_dict"])
        self.reused["pretrained embedding"] += 1
        return True

    def save_pretrained(self, key: str, backbone: nn.Module, settings: dict[str, Any]) -> None:
        """Keeps `backbone`'s weights under `key` (`settings`: what they were trained with,
        for whoever opens the file)."""
        self.computed["pretrained embedding"] += 1
        state = {k: v.detach().cpu() for k, v in backbone.state_dict().items()}
        payload = {"format": _FORMAT, "key": key, "settings": settings, "state_dict": state}
        self._write(PRETRAINED_FILE, payload)

    def save(self) -> None:
        """Writes the entries this evaluation used or computed (and no others)."""
        if self._used:
            self._write(PREDICTIONS_FILE, self._used)

    def share(self) -> tuple[dict[str, Any], Counter[str], Counter[str]]:
        """What this evaluation used and computed (entries, reused and computed counts),
        for `absorb` by another process's cache (a sharded evaluation's rank 0)."""
        return dict(self._used), Counter(self.reused), Counter(self.computed)

    def absorb(self, share: tuple[dict[str, Any], Counter[str], Counter[str]]) -> None:
        """Adds another process's `share` to this cache's (kept by `save`, counted by
        `summary`)."""
        used, reused, computed = share
        self._used.update(used)
        self.reused.update(reused)
        self.computed.update(computed)

    def summary(self) -> str | None:
        """What was reused, e.g. "pretrained embedding; from-scratch predictions 8/8" (None:
        nothing)."""
        if not self.reused:
            return None
        parts = []
        for kind, count in self.reused.items():
            total = count + self.computed[kind]
            parts.append(kind if total == 1 else f"{kind} {count}/{total}")
        return f"{'; '.join(parts)} (from {self.directory})"

    def _entries(self) -> dict[str, Any]:
        if self._stored is None:
            self._stored = {}
            path = self._path(PREDICTIONS_FILE)
            if path is not None and path.is_file():
                try:
                    self._stored = _unpack(path)
                except Exception as error:  # a damaged file is recomputed, never trusted
                    _warn(f"ignoring {path} ({type(error).__name__}: {error})")
        return self._stored

    def _path(self, name: str) -> Path | None:
        return None if self.directory is None else self.directory / name

    def _write(self, name: str, payload: dict[str, Any]) -> None:
        """`payload` to `name`: the pretrained weights with `torch.save`, the entries
        packed into an `.npz` (`_pack`: thousands of small arrays load at once)."""
        path = self._path(name)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, durable=False) as temporary:
                if name == PREDICTIONS_FILE:
                    with open(temporary, "wb") as out:
                        np.savez(out, **_pack(payload))
                else:
                    torch.save(payload, temporary)
        except OSError as error:
            _warn(f"could not keep the baselines for the next evaluation in {path}: {error}")


def _as_arrays(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _as_arrays(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _pack(entries: dict[str, Any]) -> dict[str, Any]:
    """`{key: array or {name: array}}` as one flat array per dtype and a JSON index of
    where each array lies in it (`_unpack` reads it back)."""
    flat: dict[str, list[np.ndarray]] = {}
    sizes: dict[str, int] = {}

    def place(array: np.ndarray) -> list[Any]:
        dtype = array.dtype.str
        offset = sizes.get(dtype, 0)
        flat.setdefault(dtype, []).append(np.ascontiguousarray(array).reshape(-1))
        sizes[dtype] = offset + array.size
        return [dtype, offset, list(array.shape)]

    index = {
        key: {k: place(v) for k, v in value.items()} if isinstance(value, dict) else place(value)
        for key, value in entries.items()
    }
    packed = {f"data{i}": np.concatenate(parts) for i, parts in enumerate(flat.values())}
    dtypes = {dtype: f"data{i}" for i, dtype in enumerate(flat)}
    meta = {"format": _FORMAT, "dtypes": dtypes, "entries": index}
    return {**packed, "index": np.array(json.dumps(meta))}


def _unpack(path: Path) -> dict[str, Any]:
    """The entries `_pack` wrote to `path` (`{}` for a file of another format)."""
    with np.load(path, allow_pickle=False) as saved:
        meta = json.loads(str(saved["index"]))
        if meta.get("format") != _FORMAT:
            return {}
        data = {dtype: saved[name] for dtype, name in meta["dtypes"].items()}

    def take(where: list[Any]) -> np.ndarray:
        dtype, offset, shape = where
        return data[dtype][offset : offset + int(np.prod(shape))].reshape(shape)

    return {
        key: {k: take(v) for k, v in where.items()} if isinstance(where, dict) else take(where)
        for key, where in meta["entries"].items()
    }


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
