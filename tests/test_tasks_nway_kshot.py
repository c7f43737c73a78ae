"""The N-way K-shot sampler: classes, remapped labels, no entity on both sides."""

import numpy as np
import pytest
from _task_stores import PANEL_LENGTHS, build_encoded_store

from metadist.tasks import build_task_sampler, derive_task_seeds


@pytest.fixture(scope="session")
def encoded_store(tmp_path_factory):
    return build_encoded_store(tmp_path_factory.mktemp("nway_store"), PANEL_LENGTHS)


def _entities(x):
    return x[..., 0, 0].numpy().astype(np.int64) // 10000


@pytest.mark.parametrize("class_by", ["label", "stratum"])
def test_episodes_are_n_way_k_shot(encoded_store, class_by):
    n, k, q = 3, 2, 3
    sampler = build_task_sampler(
        "nway_kshot",
        encoded_store,
        num_ways=n,
        num_shots=k,
        num_query=q,
        lookback=10,
        class_by=class_by,
    )
    classes = encoded_store.label_codes if class_by == "label" else encoded_store.stratum_codes
    units = np.arange(sampler.num_units)
    batch = sampler.sample(units, derive_task_seeds(1, 0, units))
    support_entity, query_entity = _entities(batch.support.x), _entities(batch.query.x)
    np.testing.assert_array_equal(batch.support.y[0].numpy(), np.repeat(np.arange(n), k))
    np.testing.assert_array_equal(batch.query.y[0].numpy(), np.repeat(np.arange(n), q))
    anchor_class = classes[batch.entity_index.numpy()]
    first_label_class = []
    for task in range(len(units)):
        support_class = classes[support_entity[task]].reshape(n, k)
        query_class = classes[query_entity[task]].reshape(n, q)
        # every way is one class, the same in support and query, all ways distinct
        assert np.all(support_class == support_class[:, :1])
        np.testing.assert_array_equal(query_class, np.repeat(support_class[:, :1], q, axis=1))
        assert len(np.unique(support_class[:, 0])) == n
        assert anchor_class[task] in support_class[:, 0]
        # no entity serves twice in a task
        everyone = np.concatenate([support_entity[task], query_entity[task]])
        assert len(np.unique(everyone)) == len(everyone)
        first_label_class.append(support_class[0, 0])
    # labels are remapped per task: label 0 is not always the anchor's class
    assert np.mean(np.array(first_label_class) == anchor_class) < 0.9
    # windows are contiguous rows of one entity
    rows = batch.support.x[..., 0].numpy().astype(np.int64) % 10000
    assert np.all(np.diff(rows, axis=-1) == 1)


def test_restrict_to_draws_only_from_the_pool(encoded_store):
    sampler = build_task_sampler("nway_kshot", encoded_store, num_ways=2, num_shots=1, lookback=8)
    pool = np.arange(0, 36, 2)  # even entities: classes c0 and c2 only
    restricted = sampler.restrict_to(pool)
    batch = restricted.sample(pool, derive_task_seeds(0, 0, np.arange(len(pool))))
    used = np.concatenate([_entities(batch.support.x).ravel(), _entities(batch.query.x).ravel()])
    assert set(used.tolist()) <= set(pool.tolist())
    with pytest.raises(ValueError, match="num_ways=3 but only 2 label classes"):
        build_task_sampler("nway_kshot", encoded_store, num_ways=3, lookback=8).restrict_to(pool)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"num_ways": 5}, "num_ways=5 but only 4 label classes"),
        ({"num_ways": 1}, "num_ways must be >= 2"),  # scored 1.0 by every method
        ({"num_shots": 0}, "num_shots must be an integer >= 1"),
        ({"num_shots": 9}, "num_shots \\+ num_query = 10 entities"),
        ({"class_by": "colour"}, "class_by must be 'label' or 'stratum'"),
        ({"resample_to": 10}, "resample_to applies to whole series"),
        ({"lookback": None, "resample_to": 0}, "resample_to must be an integer >= 1"),
        ({"lookback": 1000}, "lookback=1000 is longer than every entity"),
    ],
)
def test_bad_options_name_the_field(encoded_store, options, match):
    with pytest.raises(ValueError, match=match):
        build_task_sampler("nway_kshot", encoded_store, **options)
