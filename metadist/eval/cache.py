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
(`CACHE_VERSION`, metadist's source as `shared_cache.code_fingerprint` hashes it, so an
edited metadist of the same version number computes afresh, torch's and numpy's) and,
for networks, the initial weights
and the device. A changed input or setting gives another key, so a stale entry is never
used. The report says what was reused and from where (`summary`). A cache that cannot be
written costs the next evaluation time, nothing else: a warning, and the evaluation goes on.

The same keys serve every run: `metadist.eval.shared_cache.SharedCache` keeps what an
evaluation computed where another run's first evaluation on the same store and episodes
finds it; `EvalCache(run_dir / "eval", shared)` looks there where the run's own
directory misses.
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
from metadist.eval.packing import FORMAT as _FORMAT
from metadist.eval.packing import pack, unpack
from metadist.eval.shared_cache import SharedCache, code_fingerprint

# Bumped whenever a cached baseline would be computed differently.
CACHE_VERSION = 1
PREDICTIONS_FILE = "baselines.npz"
PRETRAINED_FILE = "pretrained_embedding.pt"
_VERSIONS = (__version__, torch.__version__, np.__version__)


def digest(*parts: Any) -> str:
    """SHA-256 (hex) of `parts`: arrays and tensors by dtype, shape and bytes, anything
    else by its JSON (`str` for what JSON cannot write), with the code's versions and
    source (`code_fingerprint`)."""
    h = hashlib.sha256(repr((*_VERSIONS, code_fingerprint())).encode())
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
        directory: the run's `eval/` directory; `None` keeps nothing there.
        shared: the cache shared between runs (`SharedCache`), looked up where the run's
            own misses and given what this evaluation computed; `None`: not used.
    """

    def __init__(self, directory: str | Path | None, shared: SharedCache | None = None) -> None:
        self.directory = None if directory is None else Path(directory)
        self.shared = shared
        self._stored: dict[str, Any] | None = None
        self._used: dict[str, Any] = {}
        self._from_shared: set[str] = set()  # keys the shared cache gave
        self.reused: Counter[str] = Counter()  # from the run's own directory
        self.reused_shared: Counter[str] = Counter()  # from the shared cache
        self.computed: Counter[str] = Counter()

    def get(self, kind: str, key: str) -> Any:
        """The entry of `key` (an array, or a dict of arrays) from the run's directory,
        else the shared cache, or `None`; counted as reused under `kind`."""
        found = self._entries().get(key)
        if found is not None:
            self.reused[kind] += 1
        elif self.shared is not None:
            found = self.shared.get(key)
            if found is not None:
                self.reused_shared[kind] += 1
                self._from_shared.add(key)
        if found is not None:
            self._used[key] = found
        return found

    def put(self, kind: str, key: str, value: Any) -> None:
        """Keeps `value` (a tensor or array, or a dict of them) under `key`; counted as
        computed under `kind`."""
        self._used[key] = _as_arrays(value)
        self.computed[kind] += 1

    def load_pretrained(self, key: str, backbone: nn.Module, shared: bool = True) -> bool:
        """Loads the pretrained weights of `key` into `backbone` (from the run's directory,
        else, with `shared`, the shared cache: then kept in the run's too); False when
        none are kept (or they were trained from something else)."""
        saved = self._load(self._path(PRETRAINED_FILE), key)
        if saved is not None:
            self.reused["pretrained embedding"] += 1
            if shared and self.shared is not None and not self.shared.has_pretrained(key):
                self.shared.save_pretrained(key, saved)  # kept before the shared cache was
        elif shared and self.shared is not None:
            saved = self.shared.load_pretrained(key)
            if saved is not None:
                self.reused_shared["pretrained embedding"] += 1
                self._write(PRETRAINED_FILE, saved)
        if saved is None:
            return False
        backbone.load_state_dict(saved["state_dict"])
        return True

    def save_pretrained(
        self, key: str, backbone: nn.Module, settings: dict[str, Any], shared: bool = True
    ) -> None:
        """Keeps `backbone`'s weights under `key` (`settings`: what they were trained with,
        for whoever opens the file), in the shared cache too with `shared`."""
        self.computed["pretrained embedding"] += 1
        state = {k: v.detach().cpu() for k, v in backbone.state_dict().items()}
        payload = {"format": _FORMAT, "key": key, "settings": settings, "state_dict": state}
        self._write(PRETRAINED_FILE, payload)
        if shared and self.shared is not None:
            self.shared.save_pretrained(key, payload)

    def save(self) -> None:
        """Writes the entries this evaluation used or computed (and no others) to the
        run's directory, and those the shared cache lacks to it."""
        if self._used:
            self._write(PREDICTIONS_FILE, self._used)
        if self.shared is not None:
            shared = self.shared
            lacking = [k for k in self._used if k not in self._from_shared and not shared.has(k)]
            shared.put_all({k: self._used[k] for k in lacking})

    def share(self) -> dict[str, Any]:
        """What this evaluation used and computed (entries, keys computed, counts), for
        `absorb` by another process's cache (a sharded evaluation's rank 0)."""
        return {
            "used": dict(self._used),
            "from_shared": set(self._from_shared),
            "counts": (Counter(self.reused), Counter(self.reused_shared), Counter(self.computed)),
        }

    def absorb(self, share: dict[str, Any]) -> None:
        """Adds another process's `share` to this cache's (kept by `save`, counted by
        `summary`)."""
        self._used.update(share["used"])
        self._from_shared.update(share["from_shared"])
        reused, reused_shared, computed = share["counts"]
        self.reused.update(reused)
        self.reused_shared.update(reused_shared)
        self.computed.update(computed)

    def summary(self) -> str | None:
        """What was reused and from where, e.g. "pretrained embedding; from-scratch
        predictions 8/8 (from ~/.cache/metadist/eval/...)" (None: nothing)."""
        parts = []
        for counts, where in ((self.reused, self.directory), (self.reused_shared, self._shared)):
            if counts:
                kinds = [self._count(kind, count) for kind, count in counts.items()]
                parts.append(f"{'; '.join(kinds)} (from {where})")
        return "; ".join(parts) or None

    @property
    def _shared(self) -> Path | None:
        return None if self.shared is None else self.shared.directory

    def _count(self, kind: str, count: int) -> str:
        total = self.reused[kind] + self.reused_shared[kind] + self.computed[kind]
        return kind if total == 1 else f"{kind} {count}/{total}"

    def _load(self, path: Path | None, key: str) -> dict[str, Any] | None:
        """The pretrained payload of `key` at `path`, or None."""
        if path is None or not path.is_file():
            return None
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # a damaged file is recomputed, never trusted
            _warn(f"ignoring {path} ({type(error).__name__}: {error})")
            return None
        if not isinstance(saved, dict) or saved.get("format") != _FORMAT:
            return None
        return saved if saved.get("key") == key else None

    def _entries(self) -> dict[str, Any]:
        if self._stored is None:
            self._stored = {}
            path = self._path(PREDICTIONS_FILE)
            if path is not None and path.is_file():
                try:
                    self._stored = unpack(path)
                except Exception as error:  # a damaged file is recomputed, never trusted
                    _warn(f"ignoring {path} ({type(error).__name__}: {error})")
        return self._stored

    def _path(self, name: str) -> Path | None:
        return None if self.directory is None else self.directory / name

    def _write(self, name: str, payload: dict[str, Any]) -> None:
        """`payload` to `name`: the pretrained weights with `torch.save`, the entries
        packed into an `.npz` (`packing.pack`: thousands of small arrays load at once)."""
        path = self._path(name)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, durable=False) as temporary:
                if name == PREDICTIONS_FILE:
                    with open(temporary, "wb") as out:
                        np.savez(out, **pack(payload))
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


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
