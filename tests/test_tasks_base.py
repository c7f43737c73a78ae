import numpy as np
import pytest
import torch

from metadist.batch import MetaBatch, TaskSet, cat_batches
from metadist.tasks import (
    TaskSampler,
    build_task_sampler,
    derive_task_seeds,
    get_task_sampler,
    register_task_sampler,
    task_integers,
    task_uniform,
)


def test_task_seeds_depend_on_seed_epoch_position_only():
    a = derive_task_seeds(7, 3, np.arange(100))
    assert a.dtype == np.uint64
    assert len(np.unique(a)) == 100
    np.testing.assert_array_equal(a[10:20], derive_task_seeds(7, 3, np.arange(10, 20)))
    assert not np.array_equal(a, derive_task_seeds(7, 4, np.arange(100)))
    assert not np.array_equal(a, derive_task_seeds(8, 3, np.arange(100)))


def test_task_uniform_is_uniform_and_rowwise():
    seeds = derive_task_seeds(0, 0, np.arange(2000))
    u = task_uniform(seeds, 50)
    assert u.shape == (2000, 50) and u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01
    np.testing.assert_array_equal(u[5], task_uniform(seeds[5:6], 50)[0])
    assert not np.array_equal(u, task_uniform(seeds, 50, stream=1))
    ints = task_integers(seeds, np.full(2000, 3), 4)
    assert set(np.unique(ints)) == {0, 1, 2}
    with pytest.raises(ValueError, match="high >= 1"):
        task_integers(seeds, 0, 1)


def test_sinusoid_follows_finn_et_al_family():
    sampler = build_task_sampler("sinusoid", num_support=5, num_query=100, query_grid=True)
    batch = sampler.sample(np.arange(500), derive_task_seeds(1, 0, np.arange(500)))
    assert batch.support.x.shape == (500, 5, 1) and batch.query.y.shape == (500, 100, 1)
    assert batch.support.x.dtype == torch.float32 and batch.support.x.is_contiguous()
    assert batch.support.x.abs().max() <= 5.0
    torch.testing.assert_close(batch.query.x[0, :, 0], torch.linspace(-5, 5, 100))
    amplitude = batch.query.y.abs().amax(dim=(1, 2))
    assert amplitude.max() <= 5.0 and amplitude.min() >= 0.05
    inputs, targets = batch["train"]
    assert inputs is batch.support.x and targets is batch.support.y
    with pytest.raises(KeyError, match="'train'"):
        batch["support"]


def test_unknown_sampler_lists_registered_ones():
    with pytest.raises(ValueError, match="registered: .*sinusoid"):
        get_task_sampler("no_such_sampler")
    with pytest.raises(ValueError, match="num_support"):
        build_task_sampler("sinusoid", num_support=0)


def test_user_sampler_registers_by_name():
    @register_task_sampler("constant_test")
    class Constant(TaskSampler):
        needs_store = False

        @property
        def num_units(self):
            return 3

        def sample(self, units, seeds):
            b = len(units)
            ones = torch.ones(b, 2, 1)
            idx = torch.as_tensor(units, dtype=torch.int64)
            return MetaBatch(TaskSet(ones, ones), TaskSet(ones, ones), idx, idx * 0, idx * 0 - 1)

    sampler = build_task_sampler("constant_test")
    assert isinstance(sampler, Constant)
    batch = cat_batches([sampler.sample(np.arange(2), np.zeros(2, np.uint64))] * 2)
    assert batch.num_tasks == 4
    assert batch.select(slice(1, 3)).entity_index.tolist() == [1, 0]


def test_task_integers_names_the_high_below_one():
    seeds = np.arange(4, dtype=np.uint64)
    with pytest.raises(ValueError, match=r"needs high >= 1, got high=0$"):
        task_integers(seeds, 0, 3)
    with pytest.raises(ValueError, match=r"got high\[2\]=-5 \(of 4 rows\)$"):
        task_integers(seeds, np.array([3, 4, -5, 2]), 3)
    with pytest.raises(ValueError, match=r"got high\[1\]=0 \(of 4 rows\), and 1 more below 1$"):
        task_integers(seeds, np.array([3, 0, 0, 2]), 3)
