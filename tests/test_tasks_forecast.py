"""The forecast sampler on a store whose values encode (entity, time)."""

import numpy as np
import pytest
from _task_stores import PANEL_LENGTHS, TIME_STEP, build_encoded_store

from metadist.tasks import build_task_sampler, derive_task_seeds

OPTIONS = {"lookback": 16, "horizon": 4, "num_support": 5, "num_query": 3, "stride": 2}


@pytest.fixture(scope="session")
def encoded_store(tmp_path_factory):
    return build_encoded_store(tmp_path_factory.mktemp("forecast_store"), PANEL_LENGTHS)


def _all_tasks(sampler, num_seeds=6):
    units = np.tile(np.arange(sampler.num_units), num_seeds)
    return units, sampler.sample(units, derive_task_seeds(9, 0, np.arange(len(units))))


def _decode(x):
    """(entity, row within entity) of every input step, from the `code` column."""
    code = x[..., 0].numpy().astype(np.int64)
    return code // 10000, code % 10000


@pytest.mark.parametrize("split", ["random", "end"])
def test_no_leakage_across_split_time_or_entities(encoded_store, split):
    sampler = build_task_sampler("forecast", encoded_store, split=split, **OPTIONS)
    units, batch = _all_tasks(sampler)
    tau = batch.split_time.numpy()[:, None, None]
    support_target_time = batch.support.y[..., 0].numpy() - 0.5  # target = time + 0.5
    query_target_time = batch.query.y[..., 0].numpy() - 0.5
    assert np.all(support_target_time < tau)
    assert np.all(query_target_time >= tau)
    # the last support window ends right at tau, the first query window starts at it
    assert np.all(support_target_time[:, -1, -1] == tau[:, 0, 0] - TIME_STEP)
    assert np.all(query_target_time[:, 0, 0] == tau[:, 0, 0])
    for side in (batch.support, batch.query):
        entity, row = _decode(side.x)
        assert np.all(entity == batch.entity_index.numpy()[:, None, None])
        assert np.all(np.diff(row, axis=-1) == 1)  # consecutive rows, no gaps, no crossing
        input_time = side.x[..., 1].numpy()
        np.testing.assert_array_equal(
            side.y[..., 0, 0].numpy() - 0.5, input_time[..., -1] + TIME_STEP
        )
    entity_length = encoded_store.lengths[batch.entity_index.numpy()]
    last_time = 1000 + TIME_STEP * (entity_length - 1)
    if split == "end":
        assert np.all(query_target_time[:, -1, -1] == last_time)
    else:
        assert len(np.unique(batch.split_time.numpy()[units == 3])) > 1
        assert np.all(query_target_time[:, -1, -1] <= last_time)


def test_short_entities_are_excluded_and_counted(encoded_store):
    sampler = build_task_sampler("forecast", encoded_store, **OPTIONS)
    assert sampler.rows_per_task == 16 + 2 * 4 + (5 + 3 - 2) * 2
    assert sampler.num_excluded_entities == 2
    np.testing.assert_array_equal(sampler.excluded_entities, [36, 37])
    assert sampler.num_units == 36
    np.testing.assert_array_equal(
        sampler.unit_strata(), encoded_store.stratum_codes[sampler.unit_entity]
    )


def test_labels_keep_only_their_entities(encoded_store):
    # Labels of the encoded panel: entity e has "c{e % 4}"; 36 and 37 are too short.
    sampler = build_task_sampler("forecast", encoded_store, labels=["c0", "c2"], **OPTIONS)
    np.testing.assert_array_equal(sampler.entities, np.arange(0, 38, 2))
    np.testing.assert_array_equal(sampler.unit_entity, np.arange(0, 36, 2))
    np.testing.assert_array_equal(sampler.excluded_entities, [36])
    _, batch = _all_tasks(sampler, num_seeds=2)
    assert set(batch.entity_index.tolist()) == set(range(0, 36, 2))
    assert set(encoded_store.labels[batch.entity_index.numpy()]) == {"c0", "c2"}
    one = build_task_sampler("forecast", encoded_store, labels="c1", **OPTIONS)
    np.testing.assert_array_equal(one.unit_entity, np.arange(1, 36, 4))
    everything = build_task_sampler("forecast", encoded_store, **OPTIONS)
    np.testing.assert_array_equal(everything.entities, np.arange(38))
    with pytest.raises(ValueError, match=r"labels: store .* has no label 'c9'; its labels: c0"):
        build_task_sampler("forecast", encoded_store, labels=["c0", "c9"], **OPTIONS)
    with pytest.raises(ValueError, match="empty labels list"):
        build_task_sampler("forecast", encoded_store, labels=[], **OPTIONS)


def test_padded_inputs_repeat_the_first_value_and_targets_stay_real(encoded_store):
    options = {**OPTIONS, "num_query": 2}
    sampler = build_task_sampler("forecast", encoded_store, pad_inputs=15, **options)
    assert sampler.rows_per_task == 16 + 2 * 4 + (5 + 2 - 2) * 2 - 15 == 19
    np.testing.assert_array_equal(sampler.excluded_entities, [36])  # 12 rows; 37 has 20
    units, batch = _all_tasks(sampler, num_seeds=20)
    assert 37 in batch.entity_index.tolist()  # the 20-row entity now gives tasks
    padded = 0
    for side in (batch.support, batch.query):
        entity, row = _decode(side.x)
        assert np.all(entity == batch.entity_index.numpy()[:, None, None])
        # rows never decrease; a repeated row 0 is padding, and only row 0 repeats
        steps = np.diff(row, axis=-1)
        assert np.all((steps == 1) | ((steps == 0) & (row[..., 1:] == 0)))
        padded += int((steps == 0).sum())
        # at least one real input row, and targets are real rows right after the inputs
        target_time = side.y[..., 0].numpy() - 0.5
        target_row = (target_time - 1000) / TIME_STEP
        np.testing.assert_array_equal(target_row[..., 0], row[..., -1] + 1)
        assert np.all(target_row >= 1)
    assert padded > 0
    tau = batch.split_time.numpy()[:, None, None]
    assert np.all(batch.support.y[..., 0].numpy() - 0.5 < tau)
    assert np.all(batch.query.y[..., 0].numpy() - 0.5 >= tau)
    for bad in (-1, 16, 2.0, True):
        with pytest.raises(ValueError, match="pad_inputs must be an integer"):
            build_task_sampler("forecast", encoded_store, pad_inputs=bad, **OPTIONS)


def test_recent_splits_draw_tau_from_the_end_of_its_range(encoded_store):
    free = build_task_sampler("forecast", encoded_store, **OPTIONS)
    units, batch = _all_tasks(free, num_seeds=30)
    end = build_task_sampler("forecast", encoded_store, split="end", **OPTIONS)
    last = end.split_rows(units, np.zeros(len(units), dtype=np.uint64))
    tau = free.split_rows(units, derive_task_seeds(9, 0, np.arange(len(units))))
    assert np.any(last - tau >= 6)  # without the limit, older split rows are drawn
    recent = build_task_sampler("forecast", encoded_store, recent_splits=6, **OPTIONS)
    _, limited = _all_tasks(recent, num_seeds=30)
    offset = (
        limited.split_time.numpy() - encoded_store.times[recent.unit_start[units]]
    ) // TIME_STEP
    back = last - offset
    assert back.min() == 0 and back.max() == 5  # exactly the last six split rows
    # one split row: the evaluation protocol's; a limit longer than every range: no limit
    one = build_task_sampler("forecast", encoded_store, recent_splits=1, **OPTIONS)
    assert np.array_equal(_all_tasks(one)[1].query.y, _all_tasks(end)[1].query.y)
    wide = build_task_sampler("forecast", encoded_store, recent_splits=10_000, **OPTIONS)
    assert np.array_equal(_all_tasks(wide)[1].support.x, _all_tasks(free)[1].support.x)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="recent_splits must be an integer"):
            build_task_sampler("forecast", encoded_store, recent_splits=bad, **OPTIONS)


def test_chunk_units_keep_windows_inside_their_chunk(encoded_store):
    sampler = build_task_sampler(
        "forecast", encoded_store, unit="chunk", chunk_length=60, **OPTIONS
    )
    lengths = encoded_store.lengths[:36]
    assert sampler.num_units == int(np.maximum(lengths // 60, 1).sum())
    assert np.all(sampler.unit_length >= sampler.rows_per_task)
    long_enough = lengths[sampler.unit_entity] >= 60
    assert np.all(
        (sampler.unit_length[long_enough] >= 60) & (sampler.unit_length[long_enough] < 120)
    )
    units, batch = _all_tasks(sampler)
    first = sampler.unit_start[units] - encoded_store.starts[sampler.unit_entity[units]]
    end = first + sampler.unit_length[units]
    for side in (batch.support, batch.query):
        _, row = _decode(side.x)
        target_row = (side.y[..., 0].numpy() - 0.5 - 1000) / TIME_STEP
        assert np.all(row >= first[:, None, None]) and np.all(target_row < end[:, None, None])
    # chunks tile every kept entity without overlap
    for entity in range(3):
        mine = sampler.unit_entity == entity
        starts, sizes = sampler.unit_start[mine], sampler.unit_length[mine]
        assert starts[0] == encoded_store.starts[entity]
        np.testing.assert_array_equal(starts[1:], starts[:-1] + sizes[:-1])
        assert starts[-1] + sizes[-1] == encoded_store.starts[entity] + lengths[entity]


def test_column_selection(encoded_store):
    sampler = build_task_sampler(
        "forecast",
        encoded_store,
        input_columns=["time_copy", "code"],
        target_columns=["code"],
        **OPTIONS,
    )
    _, batch = _all_tasks(sampler, num_seeds=1)
    assert batch.support.x.shape[-1] == 2 and batch.support.y.shape[-1] == 1
    entity, row = _decode(batch.support.y)
    np.testing.assert_array_equal(entity[:, 0, 0], batch.entity_index.numpy())
    assert batch.support.x.is_contiguous() and batch.support.y.is_contiguous()
    # inputs in the order asked: time first, then code
    entity_x, _ = _decode(batch.support.x[..., [1, 0]])
    np.testing.assert_array_equal(entity_x[:, 0, 0], batch.entity_index.numpy())


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"lookback": 0}, "lookback must be an integer >= 1"),
        ({"horizon": -2}, "horizon must be an integer >= 1"),
        ({"num_query": 0}, "num_query must be"),
        ({"num_support": 200}, r"no entity .* long enough .*num_support 200"),
        ({"split": "middle"}, "split must be 'random' or 'end'"),
        ({"unit": "chunk"}, "needs chunk_length"),
        ({"unit": "chunk", "chunk_length": 20}, "chunk_length=20 cannot hold one task"),
        ({"input_columns": ["nope"]}, r"input_columns: .*no columns \['nope'\]"),
        ({"target_columns": []}, "target_columns is empty"),
    ],
)
def test_bad_options_name_the_field(encoded_store, options, match):
    merged = {**OPTIONS, **options}
    with pytest.raises(ValueError, match=match):
        build_task_sampler("forecast", encoded_store, **merged)
