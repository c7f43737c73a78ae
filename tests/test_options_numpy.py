"""Options computed with numpy (a lookback from a store's lengths, columns from an array)
are the values they hold: they were refused as "must be an integer, got np.int64(97)"."""

import numpy as np
import pytest
import yaml
from _task_stores import PANEL_LENGTHS, build_encoded_store

from metadist.data import BatchMetaDataLoader
from metadist.options import to_plain
from metadist.tasks import build_task_sampler


@pytest.fixture(scope="module")
def encoded_store(tmp_path_factory):
    return build_encoded_store(tmp_path_factory.mktemp("numpy_options"), PANEL_LENGTHS)


def test_numpy_scalars_and_arrays_are_read_as_the_values_they_hold(encoded_store):
    sampler = build_task_sampler(
        "forecast",
        encoded_store,
        lookback=encoded_store.lengths.min() // 2,  # np.int64
        horizon=np.int32(2),
        num_support=np.uint8(2),
        input_columns=np.array(["code", "target"]),
        labels=np.array(["c1", "c2"]),
    )
    plain = build_task_sampler(
        "forecast",
        encoded_store,
        lookback=int(encoded_store.lengths.min() // 2),
        horizon=2,
        num_support=2,
        input_columns=["code", "target"],
        labels=["c1", "c2"],
    )
    assert sampler.options == plain.options
    assert type(sampler.options.lookback) is int
    assert yaml.safe_load(yaml.safe_dump(to_plain(sampler.options))) == to_plain(plain.options)
    batch = next(iter(BatchMetaDataLoader(sampler, np.arange(sampler.num_units), batch_size=2)))
    assert tuple(batch.support.x.shape) == (2, 2, int(encoded_store.lengths.min() // 2), 2)
    sinusoid = build_task_sampler(
        "sinusoid", num_tasks=np.int64(8), query_grid=np.bool_(True), x_range=np.array([-1, 1.0])
    )
    assert sinusoid.options.x_range == (-1.0, 1.0) and sinusoid.options.query_grid is True


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lookback": np.float64(3.0)}, "sampler.options.lookback must be an integer, got"),
        ({"lookback": np.bool_(True)}, "sampler.options.lookback must be an integer, got"),
        ({"input_columns": np.zeros((2, 2))}, "sampler.options.input_columns must be a list"),
    ],
)
def test_numpy_values_of_the_wrong_kind_are_one_line(encoded_store, options, message):
    with pytest.raises(ValueError) as caught:
        build_task_sampler("forecast", encoded_store, **options)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
