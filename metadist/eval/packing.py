"""Many small arrays in one `.npz`: the format of the evaluation caches' entry files.

`pack` lays `{key: array or {name: array}}` out as one flat array per dtype and a JSON
index of where each array lies in it, so that thousands of small entries (a statistical
forecast per series) are written and read at once; `unpack` reads them back, and
`read_index` only the keys a file holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "metadist.eval-cache/1"


def pack(entries: dict[str, Any]) -> dict[str, Any]:
    """`{key: array or {name: array}}` as `np.savez` arguments: one flat array per dtype
    (`data0`, `data1`, ...) and `index`, the JSON of where each array lies in them."""
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
    meta = {"format": FORMAT, "dtypes": dtypes, "entries": index}
    return {**packed, "index": np.array(json.dumps(meta))}


def read_index(path: Path) -> list[str]:
    """The keys the file `pack` wrote at `path` holds (`[]` for another format)."""
    with np.load(path, allow_pickle=False) as saved:
        meta = json.loads(str(saved["index"]))
    return list(meta["entries"]) if meta.get("format") == FORMAT else []


def unpack(path: Path) -> dict[str, Any]:
    """The entries `pack` wrote to `path` (`{}` for a file of another format)."""
    with np.load(path, allow_pickle=False) as saved:
        meta = json.loads(str(saved["index"]))
        if meta.get("format") != FORMAT:
            return {}
        data = {dtype: saved[name] for dtype, name in meta["dtypes"].items()}

    def take(where: list[Any]) -> np.ndarray:
        dtype, offset, shape = where
        return data[dtype][offset : offset + int(np.prod(shape))].reshape(shape)

    return {
        key: {k: take(v) for k, v in where.items()} if isinstance(where, dict) else take(where)
        for key, where in meta["entries"].items()
    }
