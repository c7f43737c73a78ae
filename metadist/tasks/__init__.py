"""Task samplers: units of a store (or synthetic families) → meta-learning tasks.

Importing this package registers the built-in samplers.
"""

from metadist.tasks import sinusoid  # noqa: F401  (registers "sinusoid")
from metadist.tasks.base import (
    TaskSampler,
    build_task_sampler,
    derive_task_seeds,
    get_task_sampler,
    register_task_sampler,
    registered_task_samplers,
    task_integers,
    task_uniform,
)

__all__ = [
    "TaskSampler",
    "build_task_sampler",
    "derive_task_seeds",
    "get_task_sampler",
    "register_task_sampler",
    "registered_task_samplers",
    "task_integers",
    "task_uniform",
]
