"""Bad arguments to the partitioner, and a loader of a split that has no units, are named:
float pinned units were truncated to other units, a NaN fraction raised "cannot convert
float NaN to integer", and a loader of an empty split said `world_size=1 is larger than
the 0 tasks`."""

import math

import numpy as np
import pytest

from metadist.data import BatchMetaDataLoader, StratifiedTaskPartitioner
from metadist.tasks import build_task_sampler

STRATA = np.array([0, 0, 1, 1, 2, 2, 0, 1, 2, 0], dtype=np.int64)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"pinned_test_units": [1.5]}, "pinned_test_units must be integer unit indices, got dtype"),
        ({"fractions": (math.nan, 0.5, 0.5)}, "fractions must be finite numbers, got (nan, 0.5"),
        ({"fractions": (0.8, math.inf, 0.1)}, "fractions must be finite numbers, got (0.8, inf"),
    ],
)
def test_bad_partitioner_arguments_are_named(keywords, message):
    with pytest.raises(ValueError) as caught:
        StratifiedTaskPartitioner(STRATA, seed=0, **keywords)
    assert str(caught.value).startswith(message), caught.value


def test_integer_pins_still_pin():
    partitioner = StratifiedTaskPartitioner(STRATA, seed=0, pinned_test_units=np.array([3]))
    assert 3 in partitioner.units("test")


def test_a_loader_of_a_split_without_units_says_so():
    sampler = build_task_sampler("sinusoid", num_tasks=10)
    partitioner = StratifiedTaskPartitioner(STRATA, seed=0, fractions=(1.0, 0.0, 0.0))
    with pytest.raises(ValueError) as caught:
        BatchMetaDataLoader(sampler, partitioner, split="val", batch_size=1)
    assert str(caught.value) == (
        "split 'val' has no units to deal tasks from: the partitioner's fractions give it no "
        "share, or the unit array is empty"
    )
