"""Task samplers: units of a store (or synthetic families) → meta-learning tasks.

Importing this package registers the built-in samplers ("forecast", "nway_kshot",
"sinusoid").
"""

from metadist.tasks.base import TaskSampler, derive_task_seeds, task_integers, task_uniform
from metadist.tasks.forecast import ForecastSampler
from metadist.tasks.nway_kshot import NWayKShotSampler
from metadist.tasks.registry import (
    SAMPLERS,
    build_task_sampler,
    get_task_sampler,
    register_task_sampler,
    registered_task_samplers,
)
from metadist.tasks.sinusoid import SinusoidSampler

__all__ = [
    "SAMPLERS",
    "ForecastSampler",
    "NWayKShotSampler",
    "SinusoidSampler",
    "TaskSampler",
    "build_task_sampler",
    "derive_task_seeds",
    "get_task_sampler",
    "register_task_sampler",
    "registered_task_samplers",
    "task_integers",
    "task_uniform",
]
