"""`metadist.tasks.series_end`: the one home of the windows ending at a series' end.

The forecast sampler, the holdout tasks and `Run.forecast` each cut these windows with
code of their own before; each old computation is copied here verbatim (as a reference)
and the shared windows must give exactly the same values, for both padding policies and
for series shorter than the windows.
"""

import numpy as np
import pytest

from metadist.tasks.series_end import SeriesEndWindows
from metadist.tasks.windows import WindowGatherer


def _series(num_rows: int, num_columns: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + num_rows)
    return rng.normal(size=(num_rows, num_columns)).astype(np.float32)


# --------------------------------------------------- the old computations, verbatim
def _old_api_windows(scaled, input_columns, target_columns, big_l, big_h, k, s, pad):
    """`metadist/api.py` `_forecast_batch`, one entity (before series_end)."""
    needed = big_l + big_h + (k - 1) * s - pad
    m = len(scaled)
    if m < max(needed, 1) or m < big_l - pad:
        raise ValueError(f"has {m} rows; needs at least {needed}")
    inputs = WindowGatherer(scaled, input_columns, big_l)
    targets = WindowGatherer(scaled, target_columns, big_h)
    starts = (m - big_l - big_h) - (k - 1 - np.arange(k)) * s
    first = np.zeros(1, np.int64)
    support_x = inputs.gather(starts, first) if pad else inputs.gather(starts)
    support_y = targets.gather(starts + big_l)
    query_start = np.array([m - big_l])
    query_x = inputs.gather(query_start, first) if pad else inputs.gather(query_start)
    return support_x, support_y, query_x


def _old_holdout_windows(series, inputs, targets, lookback, horizon, num_support, stride):
    """`metadist/tasks/holdout.py` `holdout_batches`, one entity (before series_end)."""
    window = lookback + horizon
    length = max(int(len(series)), window)
    num_windows = min(num_support, (length - window) // stride + 1)
    if series.shape[0] < window:
        pad = np.repeat(series[:1], window - series.shape[0], axis=0)
        series = np.concatenate([pad, series])
    length = series.shape[0]
    starts = length - window - stride * np.arange(num_windows)[::-1]
    rows = starts[:, None] + np.arange(window)[None, :]  # [K, L + H]
    support_x = series[rows[:, :lookback]][:, :, inputs]
    support_y = series[rows[:, lookback:]][:, :, targets]
    query_x = series[length - lookback :, inputs][None]
    return support_x, support_y, query_x


def _old_sampler_windows(values, unit_start, base, inputs, targets, big_l, big_h, k, q, s, pad):
    """`ForecastSampler.sample`'s windows (before series_end)."""
    support_start = (base - big_l - big_h)[:, None] - (k - 1 - np.arange(k)) * s  # [B, K]
    query_start = (base - big_l)[:, None] + np.arange(q) * s  # [B, Q]
    if pad:
        first_row = unit_start[:, None]
        support_x = inputs.gather(support_start, first_row)
        query_x = inputs.gather(query_start, first_row)
    else:
        support_x, query_x = inputs.gather(support_start), inputs.gather(query_start)
    support_y = targets.gather(support_start + big_l)
    query_y = targets.gather(query_start + big_l)
    return support_x, support_y, query_x, query_y


def _assert_same(new, old):
    assert len(new) == len(old)
    for a, b in zip(new, old, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


COLUMNS = [([0, 1, 2], [2]), ([2, 0], [1, 2])]  # a contiguous run, and a fancy gather


# ----------------------------------------------------------------------- the tests
@pytest.mark.parametrize("input_columns,target_columns", COLUMNS)
@pytest.mark.parametrize(
    "lookback,horizon,num_support,stride,pad_inputs,num_rows",
    [
        (8, 4, 3, 2, 0, 40),  # plenty of rows
        (8, 4, 3, 2, 0, 16),  # exactly L + H + (K-1)·s
        (8, 4, 3, 2, 5, 11),  # exactly L + H + (K-1)·s - P: the first windows padded
        (8, 2, 1, 1, 7, 3),  # shorter than one window (and than L): the query padded too
        (6, 3, 4, 1, 2, 25),
    ],
)
def test_inputs_padding_gives_the_api_windows(
    input_columns, target_columns, lookback, horizon, num_support, stride, pad_inputs, num_rows
):
    series = _series(num_rows)
    windows = SeriesEndWindows(
        lookback, horizon, num_support, stride, padding="inputs", pad_inputs=pad_inputs
    )
    assert windows.rows_needed == lookback + horizon + (num_support - 1) * stride - pad_inputs
    assert windows.num_windows(num_rows) == num_support
    new = windows.cut(series, input_columns, target_columns)
    old = _old_api_windows(
        series, input_columns, target_columns, lookback, horizon, num_support, stride, pad_inputs
    )
    _assert_same(new, old)


def test_inputs_padding_rejects_a_series_too_short():
    windows = SeriesEndWindows(8, 4, 3, 2, padding="inputs", pad_inputs=5)
    with pytest.raises(ValueError):
        _old_api_windows(_series(10), [0], [0], 8, 4, 3, 2, 5)
    with pytest.raises(ValueError, match=r"10 rows is too short .* = 8 \+ 4 \+ 2\*2 - 5 = 11$"):
        windows.cut(_series(10), [0], [0])


@pytest.mark.parametrize("input_columns,target_columns", COLUMNS)
@pytest.mark.parametrize(
    "lookback,horizon,num_support,stride,num_rows",
    [
        (8, 4, 3, 2, 40),  # K windows
        (8, 4, 12, 2, 30),  # fewer than K fit: (30 - 12) // 2 + 1 = 10 of 12
        (8, 4, 10, 3, 30),  # (30 - 12) // 3 + 1 = 7 windows
        (8, 4, 3, 2, 12),  # exactly one window
        (8, 4, 3, 2, 9),  # shorter than L + H: front-filled, targets padded too
        (8, 4, 3, 2, 3),  # shorter than L and than H
        (8, 4, 3, 2, 1),  # one row
    ],
)
def test_series_padding_gives_the_holdout_windows(
    input_columns, target_columns, lookback, horizon, num_support, stride, num_rows
):
    series = _series(num_rows)
    windows = SeriesEndWindows(lookback, horizon, num_support, stride, padding="series")
    new = windows.cut(series, input_columns, target_columns)
    old = _old_holdout_windows(
        series, input_columns, target_columns, lookback, horizon, num_support, stride
    )
    _assert_same(new, old)
    assert windows.num_windows(num_rows) == len(old[0])


@pytest.mark.parametrize("pad_inputs", [0, 3])
@pytest.mark.parametrize("num_query", [1, 3])
def test_the_sampler_windows_around_split_rows(pad_inputs, num_query):
    """The forecast sampler's batched windows of a store (several units, split rows
    anywhere in their range), as `ForecastSampler.sample` cuts them."""
    big_l, big_h, k, s = 6, 3, 3, 2
    lengths = np.array([30, 22, 25, 40])
    unit_start = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    values = _series(int(lengths.sum()), num_columns=4)
    inputs = WindowGatherer(values, [0, 1, 3], big_l)
    targets = WindowGatherer(values, [3], big_h)
    windows = SeriesEndWindows(big_l, big_h, k, s, padding="inputs", pad_inputs=pad_inputs)
    rng = np.random.default_rng(1)
    low = windows.rows_needed
    high = lengths - big_h - (num_query - 1) * s
    tau = np.array([rng.integers(low, h + 1) for h in high])
    tau[0] = low  # the earliest split: with pad_inputs, its first window is padded
    units = np.array([0, 1, 2, 3, 1, 0])
    base = unit_start[units] + tau[units]
    first_row = unit_start[units][:, None]
    support_start = windows.support_starts(base)
    query_start = windows.query_starts(base, num_query)
    new = (
        windows.inputs(inputs, support_start, first_row),
        windows.targets(targets, support_start, first_row),
        windows.inputs(inputs, query_start, first_row),
        windows.targets(targets, query_start, first_row),
    )
    old = _old_sampler_windows(
        values, unit_start[units], base, inputs, targets, big_l, big_h, k, num_query, s, pad_inputs
    )
    _assert_same(new, old)
    assert support_start.shape == (len(units), k) and query_start.shape == (len(units), num_query)


def test_bad_policies_are_named():
    with pytest.raises(ValueError, match="padding must be one of"):
        SeriesEndWindows(8, 4, 3, 2, padding="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pad_inputs must be in"):
        SeriesEndWindows(8, 4, 3, 2, padding="inputs", pad_inputs=8)
    with pytest.raises(ValueError, match="only used with padding='inputs'"):
        SeriesEndWindows(8, 4, 3, 2, padding="series", pad_inputs=1)
