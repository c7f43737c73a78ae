"""Every registered task sampler: shapes, dtypes, determinism, seed sensitivity."""

import numpy as np
import pytest
import torch
from _task_stores import PANEL_LENGTHS, build_encoded_store

from metadist.tasks import (
    SAMPLERS,
    build_task_sampler,
    derive_task_seeds,
    get_task_sampler,
    registered_task_samplers,
)

# Options that make the built-ins small; a sampler registered elsewhere (a user's) is
# built with its defaults.
OPTIONS = {
    "forecast": {"lookback": 16, "horizon": 4, "num_support": 5, "num_query": 3, "stride": 2},
    "nway_kshot": {"num_ways": 3, "num_shots": 2, "num_query": 2, "lookback": 8},
    "sinusoid": {"num_support": 5, "num_query": 7, "num_tasks": 50},
}
NUM_TASKS = 8


@pytest.fixture(scope="session")
def encoded_store(tmp_path_factory):
    return build_encoded_store(tmp_path_factory.mktemp("sampler_store"), PANEL_LENGTHS)


def _build(name, store):
    return build_task_sampler(name, store, **OPTIONS.get(name, {}))


def _draw(sampler, seed, units=None):
    if units is None:
        units = np.arange(NUM_TASKS) % sampler.num_units
    return sampler.sample(units, derive_task_seeds(seed, 0, np.arange(len(units))))


def _tensors(batch):
    return [batch.support.x, batch.support.y, batch.query.x, batch.query.y]


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_builtins_keep_their_options_typed(encoded_store, name):
    """A built-in sampler keeps the options it was built with as its own `Options`."""
    cls = get_task_sampler(name)
    assert SAMPLERS.options_schema(name) is cls.Options
    sampler = _build(name, encoded_store)
    assert isinstance(sampler.options, cls.Options)
    assert {key: getattr(sampler.options, key) for key in OPTIONS[name]} == OPTIONS[name]


def test_every_builtin_is_covered():
    assert {"forecast", "nway_kshot", "sinusoid"} <= set(registered_task_samplers())


@pytest.mark.parametrize("name", registered_task_samplers())
def test_shapes_and_dtypes(name, encoded_store):
    sampler = _build(name, encoded_store)
    batch = _draw(sampler, seed=0)
    assert batch.num_tasks == NUM_TASKS
    for tensor in _tensors(batch):
        assert tensor.shape[0] == NUM_TASKS and tensor.is_contiguous()
    assert batch.support.x.dtype == torch.float32 and batch.query.x.dtype == torch.float32
    for side in (batch.support, batch.query):
        assert side.y.dtype in (torch.float32, torch.int64)
    for meta in (batch.entity_index, batch.stratum, batch.split_time):
        assert meta.shape == (NUM_TASKS,) and meta.dtype == torch.int64
    assert batch.stratum.min() >= 0
    inputs, targets = batch["train"]
    assert inputs is batch.support.x and targets is batch.support.y
    if name == "forecast":
        assert batch.support.x.shape == (NUM_TASKS, 5, 16, 3)
        assert batch.support.y.shape == (NUM_TASKS, 5, 4, 1)
        assert batch.query.x.shape == (NUM_TASKS, 3, 16, 3)
        assert batch.query.y.shape == (NUM_TASKS, 3, 4, 1)
    if name == "nway_kshot":
        assert batch.support.x.shape == (NUM_TASKS, 6, 8, 3)
        assert batch.support.y.shape == (NUM_TASKS, 6) and batch.support.y.dtype == torch.int64
        assert batch.query.x.shape == (NUM_TASKS, 6, 8, 3)
        assert batch.query.y.max() == 2 and batch.query.y.min() == 0


@pytest.mark.parametrize("name", registered_task_samplers())
def test_deterministic_per_task_and_seed_sensitive(name, encoded_store):
    sampler = _build(name, encoded_store)
    first, again = _draw(sampler, seed=5), _draw(_build(name, encoded_store), seed=5)
    for a, b in zip(_tensors(first), _tensors(again), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    other = _draw(sampler, seed=6)
    assert any(not torch.equal(a, b) for a, b in zip(_tensors(first), _tensors(other), strict=True))
    # task i depends on (unit i, seed i) only, not on the other tasks of its batch
    units = np.arange(NUM_TASKS) % sampler.num_units
    seeds = derive_task_seeds(5, 0, np.arange(NUM_TASKS))
    part = sampler.sample(units[3:5], seeds[3:5])
    for a, b in zip(_tensors(part), _tensors(first.select(slice(3, 5))), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
