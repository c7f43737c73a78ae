"""How many threads an evaluation uses (what it shows while it runs: `metadist.progress`).

`eval_threads` runs evaluation on one intra-op thread unless `OMP_NUM_THREADS` is set:
the models are small, so the per-op thread hand-off costs more than it saves (measured
in the README's Evaluation section).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def eval_threads() -> Iterator[int]:
    """Runs the block on one intra-op thread unless `OMP_NUM_THREADS` is set.

    Yields the thread count in use; the previous count is restored afterwards.
    """
    before = torch.get_num_threads()
    if os.environ.get("OMP_NUM_THREADS"):
        yield before
        return
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(before)
