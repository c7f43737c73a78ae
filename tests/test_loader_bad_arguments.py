"""Arguments of the wrong kind given to `BatchMetaDataLoader` from Python are refused
naming them: a fractional batch size, rank or seed was silently rounded down, float unit
indices truncated to other units, and a state that is not the loader's raised a bare
`TypeError` or "invalid literal for int()"."""

import numpy as np
import pytest

from metadist.data import BatchMetaDataLoader
from metadist.tasks import build_task_sampler


@pytest.fixture
def sampler():
    return build_task_sampler("sinusoid", num_tasks=20)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"batch_size": 2.5}, "batch_size must be an integer, got 2.5"),
        ({"batch_size": 2, "world_size": 2, "rank": 0.5}, "rank must be an integer, got 0.5"),
        ({"batch_size": 2, "seed": 1.5}, "seed must be an integer, got 1.5"),
        ({"batch_size": 2, "num_workers": -1}, "num_workers must be >= 0, got -1"),
        ({"batch_size": 2, "num_workers": 1.0}, "num_workers must be an integer, got 1.0"),
    ],
)
def test_counts_that_are_not_whole_numbers_are_refused(sampler, keywords, message):
    with pytest.raises(ValueError) as caught:
        BatchMetaDataLoader(sampler, np.arange(20), **keywords)
    assert str(caught.value) == message


def test_numpy_integers_are_counts_and_units(sampler):
    loader = BatchMetaDataLoader(
        sampler, np.arange(20, dtype=np.int32), batch_size=np.int64(4), seed=np.uint8(3)
    )
    assert len(loader) == 5 and len(list(loader)) == 5


def test_unit_indices_must_be_integers(sampler):
    with pytest.raises(ValueError) as caught:
        BatchMetaDataLoader(sampler, np.array([0.5, 1.7, 3.2]), batch_size=1)
    assert str(caught.value) == (
        "units must be integer unit indices (or a StratifiedTaskPartitioner), got dtype float64"
    )


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (None, "loader state must be a mapping (a loader's state_dict()), got NoneType"),
        ([0, 4], "loader state must be a mapping (a loader's state_dict()), got list"),
        ({"epoch": "x", "tasks_consumed": 4}, "loader state epoch='x' is not an integer"),
        ({"epoch": 0, "tasks_consumed": 4.5}, "loader state tasks_consumed=4.5 is not an integer"),
    ],
)
def test_a_state_that_is_not_the_loaders_is_named(sampler, state, message):
    loader = BatchMetaDataLoader(sampler, np.arange(20), batch_size=2)
    with pytest.raises(ValueError) as caught:
        loader.load_state_dict(state)
    assert str(caught.value) == message
    assert loader.state_dict()["tasks_consumed"] == 0  # nothing half-loaded
