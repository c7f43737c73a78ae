"""`fill_forward`, the forward fill of the ingest's last pass, against a plain loop."""

from __future__ import annotations

import numpy as np
import pytest

from metadist.store.order import fill_forward


def _reference(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    out = values.copy()
    for start, length in zip(starts, lengths, strict=True):
        for j in range(values.shape[1]):
            column = out[start : start + length, j]
            finite = np.flatnonzero(np.isfinite(column))
            last = column[finite[0]]  # values before the first finite one take it
            for k in range(length):
                if np.isfinite(column[k]):
                    last = column[k]
                else:
                    column[k] = last
    return out


@pytest.mark.parametrize("seed", range(5))
def test_fill_forward_matches_a_plain_loop(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 40, size=30)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    values = rng.standard_normal((int(lengths.sum()), 4)).astype(np.float32)
    holes = rng.random(values.shape) < 0.2
    values[holes] = rng.choice([np.nan, np.inf, -np.inf], size=int(holes.sum()))
    values[starts[3] : starts[3] + 2, 1] = np.nan  # a run at an entity's start
    values[starts[5] + lengths[5] - 3 : starts[5] + lengths[5], 2] = np.nan  # at its end
    for e in range(len(lengths)):  # every entity keeps a finite value in every column
        values[starts[e] + lengths[e] // 2] = np.float32(e)
    expected = _reference(values, starts, lengths)

    assert fill_forward(values, starts, lengths)
    np.testing.assert_array_equal(values, expected)
    assert not fill_forward(values, starts, lengths)  # nothing left to fill
