"""Each rank's random number generators: seeding, capturing and restoring their state.

A checkpoint holds every rank's state (`rng_state`), so a resumed run draws the same
dropout masks and random numbers as one that never stopped; a fresh run, or one resumed
on another number of ranks, seeds each rank from the run's seed instead (`seed_rank`).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from metadist.train.distributed import DistEnv


def seed_rank(seed: int, env: DistEnv) -> None:
    """Seeds torch, Python and NumPy from `seed` and the rank: every rank draws
    differently (dropout masks), reproducibly."""
    mixed = (seed * 1_000_003 + env.rank + 1) % (2**63)
    torch.manual_seed(mixed)
    random.seed(mixed)
    np.random.seed(mixed % (2**32))


def rng_state(env: DistEnv) -> dict[str, Any]:
    """This rank's generator states (torch, Python, NumPy, and CUDA on a GPU), as tensors
    and plain values a checkpoint can hold."""
    state: Any = np.random.get_state()  # the legacy tuple (the stubs also allow a dict)
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [state[0], torch.from_numpy(state[1].astype(np.int64)), *state[2:]],
    }
    if env.device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(env.device)
    return out


def set_rng_state(state: dict[str, Any], env: DistEnv) -> None:
    """Restores the generator states `rng_state` captured (CUDA's only on a GPU)."""
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.int64).astype(np.uint32), *rest))
    if "cuda" in state and env.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], env.device)


def _as_tuple(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(v) for v in value)
    return value
