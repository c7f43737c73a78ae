"""An N-way sampler whose lookback leaves too few entities per class named only num_shots
/ num_query as the lever, though the entities it lost were those shorter than the
lookback; it names the lookback too, with how many entities it leaves out."""

import pytest
from _task_stores import PANEL_LENGTHS, build_encoded_store

from metadist.tasks import build_task_sampler


@pytest.fixture(scope="module")
def encoded_store(tmp_path_factory):
    return build_encoded_store(tmp_path_factory.mktemp("nway_lookback"), PANEL_LENGTHS)


def test_a_lookback_that_leaves_classes_short_is_named(encoded_store):
    short = sum(length < 300 for length in PANEL_LENGTHS)
    with pytest.raises(ValueError) as caught:
        build_task_sampler(
            "nway_kshot", encoded_store, num_ways=2, num_shots=2, num_query=1, lookback=300
        )
    message = str(caught.value)
    assert "lower sampler.options.num_shots / num_query, or sampler.options.lookback" in message
    assert f"({short} of the store's entities are shorter than lookback=300" in message


def test_without_short_entities_the_lookback_is_not_named(encoded_store):
    with pytest.raises(ValueError) as caught:
        build_task_sampler(
            "nway_kshot", encoded_store, num_ways=2, num_shots=20, num_query=1, lookback=8
        )
    assert "lower sampler.options.num_shots / num_query" in str(caught.value)
    assert "sampler.options.lookback" not in str(caught.value)
