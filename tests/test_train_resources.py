"""The memory estimate made before a run allocates anything."""

import resource

import pytest

from metadist.models import build_model
from metadist.train.resources import check_memory, count_parameters, estimate_memory


def test_parameters_are_counted_without_allocating_them():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    huge = count_parameters(lambda: build_model("mlp", (1,), (1,), hidden_sizes=[50000, 50000]))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert huge == 1 * 50000 + 50000 + 50000 * 50000 + 50000 + 50000 * 1 + 1
    assert grown_kib < 200_000  # 10 GB of float32 were never allocated
    small = build_model("mlp", (3,), (2,), hidden_sizes=[7])
    counted = count_parameters(lambda: build_model("mlp", (3,), (2,), hidden_sizes=[7]))
    assert counted == sum(p.numel() for p in small.parameters())


def test_second_order_keeps_a_copy_per_inner_step_and_task():
    second = estimate_memory(1000, tasks_per_rank=5, inner_steps=3, first_order=False)
    first = estimate_memory(1000, tasks_per_rank=5, inner_steps=3, first_order=True)
    none = estimate_memory(1000, tasks_per_rank=5, inner_steps=0, first_order=False)
    assert second.state_bytes == first.state_bytes == none.state_bytes == 1000 * 4 * 4
    assert second.inner_loop_bytes == 3 * first.inner_loop_bytes == 1000 * 4 * 3 * 2 * 5
    assert none.inner_loop_bytes == 0


def test_a_run_over_the_memory_is_refused_in_one_line_naming_the_fields():
    estimate = estimate_memory(10**9, tasks_per_rank=25, inner_steps=1, first_order=False)
    with pytest.raises(ValueError) as refused:
        check_memory(estimate, available=8 * 2**30, fields="model.options.hidden_sizes")
    message = str(refused.value)
    assert "\n" not in message and "GiB" in message and "model.options.hidden_sizes" in message
    check_memory(estimate, available=None, fields="x")  # unknown: not refused
    check_memory(estimate_memory(10, 1, 1, False), available=2**30, fields="x")
