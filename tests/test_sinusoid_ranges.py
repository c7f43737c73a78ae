"""The sinusoid sampler built in Python refuses ranges that are not finite: `x_range=(0,
nan)` was accepted and every task it drew was NaN (a config's values are checked finite
before they reach it; a sampler built directly had no such check)."""

import math

import numpy as np
import pytest

from metadist.data import BatchMetaDataLoader
from metadist.tasks import build_task_sampler


@pytest.mark.parametrize(
    ("field", "bounds"),
    [("x_range", (0.0, math.nan)), ("amplitude_range", (0.1, math.inf)),
     ("phase_range", (-math.inf, 0.0))],
)  # fmt: skip
def test_a_range_that_is_not_finite_is_refused_naming_it(field, bounds):
    with pytest.raises(ValueError) as caught:
        build_task_sampler("sinusoid", num_tasks=8, **{field: bounds})
    assert str(caught.value) == (
        f"sinusoid sampler: {field} must be two finite numbers, got {list(bounds)} (every "
        "task would be NaN or inf)"
    )


def test_finite_ranges_in_either_order_give_finite_tasks():
    sampler = build_task_sampler("sinusoid", num_tasks=8, amplitude_range=(5.0, 1.0))
    batch = next(iter(BatchMetaDataLoader(sampler, np.arange(8), batch_size=8)))
    assert np.isfinite(batch.support.y.numpy()).all()
    assert (batch.support.y.abs() <= 5.0).all()
