"""Meta-batches of the sinusoid sampler at fixed positions, for tests of the meta-step."""

from __future__ import annotations

import numpy as np

from metadist.batch import MetaBatch
from metadist.tasks import build_task_sampler, derive_task_seeds


def sinusoid_batches(num: int, num_tasks: int) -> list[MetaBatch]:
    """`num` meta-batches of `num_tasks` sinusoid tasks (5 support, 5 query points), the
    tasks at positions `i * num_tasks ...` of epoch 0, seed 0."""
    sampler = build_task_sampler("sinusoid", num_support=5, num_query=5)
    out = []
    for i in range(num):
        positions = np.arange(i * num_tasks, (i + 1) * num_tasks)
        out.append(sampler.sample(positions, derive_task_seeds(0, 0, positions)))
    return out
