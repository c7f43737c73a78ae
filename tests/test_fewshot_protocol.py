"""Evaluation is confined to its split, for every registered sampler; class-disjoint splits;
whole-series episodes; the classification baselines."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from _task_stores import PANEL_LENGTHS, build_encoded_store

from metadist.batch import MetaBatch, TaskSet
from metadist.data import BatchMetaDataLoader, build_partitioner
from metadist.eval import baselines
from metadist.store import ingest
from metadist.tasks import (
    TaskSampler,
    build_task_sampler,
    derive_task_seeds,
    get_task_sampler,
    registered_task_samplers,
)

# Options that make each built-in sampler fit the small test stores; a sampler registered
# later is built with its defaults.
_OPTIONS = {
    "nway_kshot": {"num_ways": 2, "num_shots": 1, "num_query": 1, "lookback": 8},
    "forecast": {"lookback": 8, "horizon": 4, "num_support": 3},
}


def _entities(x: torch.Tensor) -> set[int]:
    """Entities of the examples `[B, M, L, F]` whose first column encodes e*10000 + row."""
    return set((x[..., 0].numpy().astype(np.int64) // 10000).ravel().tolist())


def _batch_entities(batch: MetaBatch) -> set[int]:
    return _entities(batch.support.x) | _entities(batch.query.x)


@pytest.fixture(scope="module")
def encoded_store(tmp_path_factory):
    return build_encoded_store(tmp_path_factory.mktemp("protocol_store"), PANEL_LENGTHS)


def _class_panel(path, num_classes=10, per_class=4, lengths=None, num_features=1):
    """A panel of `num_classes * per_class` entities, label k{e % num_classes}; feature
    `code` = e*10000 + row (and `f{j}` = row * (j + 1) for further features)."""
    entity, step, feature = [], [], []
    for e in range(num_classes * per_class):
        n = lengths[e] if lengths is not None else 30 + e % 7
        entity += [e] * n
        step += list(range(n))
    entity, step = np.asarray(entity), np.asarray(step)
    columns = {
        "entity": pa.array([f"e{e:03d}" for e in entity]),
        "t": pa.array(step, pa.int64()),
        "code": pa.array((entity * 10000 + step).astype(np.float64)),
        "cls": pa.array([f"k{e % num_classes}" for e in entity]),
        "grp": pa.array([f"g{e % 2}" for e in entity]),
    }
    for j in range(1, num_features):
        feature.append(f"f{j}")
        columns[f"f{j}"] = pa.array((step * (j + 1)).astype(np.float64))
    pq.write_table(pa.table(columns), path)
    return ["code", *feature]


def _class_store(directory, scaling):
    features = _class_panel(directory / "panel.parquet")
    return ingest(
        directory / "panel.parquet",
        directory / "store",
        entity_col="entity",
        time_col="t",
        features=features,
        targets=["code"],
        stratum_col="grp",
        label_col="cls",
        scaling=scaling,
        progress=False,
    )


@pytest.fixture(scope="module")
def class_store(tmp_path_factory):
    """Unscaled, so every value still encodes its entity and row."""
    return _class_store(tmp_path_factory.mktemp("class_store"), "none")


@pytest.fixture(scope="module")
def scaled_class_store(tmp_path_factory):
    """The class panel with each entity z-normalised (as the UCR ingest does)."""
    return _class_store(tmp_path_factory.mktemp("scaled_class_store"), "per-entity")


def _sampler(name, store):
    cls = get_task_sampler(name)
    return build_task_sampler(name, store if cls.needs_store else None, **_OPTIONS.get(name, {}))


@pytest.mark.parametrize("name", registered_task_samplers())
@pytest.mark.parametrize("split_by", ["unit", "label", "auto"])
def test_no_example_of_any_split_comes_from_outside_it(encoded_store, class_store, name, split_by):
    store = class_store if split_by in ("label", "auto") else encoded_store
    sampler = _sampler(name, store)
    if sampler.unit_entities() is None:
        # Units that are not store entities (task numbers) hold no data to leak.
        assert not sampler.draws_across_units
        if split_by != "unit":
            with pytest.raises(ValueError, match=f"data.split_by={split_by} needs a sampler whose"):
                build_partitioner(sampler, None, seed=0, split_by=split_by)
        return
    fractions = (0.6, 0.2, 0.2) if split_by != "unit" else (0.4, 0.3, 0.3)
    part = build_partitioner(sampler, store, seed=3, fractions=fractions, split_by=split_by)
    unit_entities = sampler.unit_entities()
    for split in ("train", "val", "test"):
        allowed = set(unit_entities[part.units(split)].tolist())
        if split != "test":
            loader = BatchMetaDataLoader(sampler, part, batch_size=2, split=split, seed=1)
            for batch in loader:
                assert _batch_entities(batch) <= allowed
        tasks = sampler.for_evaluation(
            part.units(split), split=split, tasks_per_unit=2 if sampler.draws_across_units else 1
        )
        seen = set()
        for batch in tasks.batches(5, 7):
            used = _batch_entities(batch)
            assert used <= allowed, f"{split}: {sorted(used - allowed)} come from elsewhere"
            seen |= used
        assert seen  # something was evaluated


class _LeakyPairs(TaskSampler):
    """Each task reads its unit and the next one, and cannot be confined (not registered,
    so the registry-wide sampler tests do not pick it up)."""

    name = "_test_leaky_pairs"
    draws_across_units = True

    def __init__(self, store):
        self.store = store

    @property
    def num_units(self):
        return self.store.num_entities

    def unit_entities(self):
        return np.arange(self.num_units)

    def sample(self, units, seeds):
        x = torch.zeros(len(units), 2, 4, 1)
        return MetaBatch(
            support=TaskSet(x, torch.zeros(len(units), 2, 1, 1)),
            query=TaskSet(x, torch.zeros(len(units), 2, 1, 1)),
            entity_index=torch.as_tensor(units),
            stratum=torch.zeros(len(units), dtype=torch.int64),
            split_time=torch.full((len(units),), -1),
        )


def test_a_sampler_that_cannot_be_confined_is_refused(encoded_store):
    sampler = _LeakyPairs(encoded_store)
    part = build_partitioner(sampler, encoded_store, seed=0)
    with pytest.raises(ValueError, match="'_test_leaky_pairs' draws each task from several units"):
        sampler.for_evaluation(part.units("test"))
    with pytest.raises(ValueError, match="split 'train': task sampler '_test_leaky_pairs'"):
        BatchMetaDataLoader(sampler, part, batch_size=1, split="train")


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_class_splits_are_disjoint_and_episodes_keep_to_them(class_store, seed):
    sampler = build_task_sampler(
        "nway_kshot", class_store, num_ways=2, num_shots=1, num_query=2, lookback=8
    )
    part = build_partitioner(
        sampler, class_store, seed=seed, fractions=(0.6, 0.2, 0.2), split_by="label"
    )
    classes = {
        s: set(sampler.unit_classes()[part.units(s)].tolist()) for s in ("train", "val", "test")
    }
    assert [len(classes[s]) for s in ("train", "val", "test")] == [6, 2, 2]
    assert not (classes["train"] & classes["val"] or classes["train"] & classes["test"])
    assert not classes["val"] & classes["test"]
    # every unit of a class lies in its class's split
    assert sum(len(part.units(s)) for s in ("train", "val", "test")) == sampler.num_units
    codes = np.asarray(class_store.label_codes)
    for split in ("train", "test"):
        tasks = sampler.for_evaluation(part.units(split), split=split, tasks_per_unit=3)
        for batch in tasks.batches(8, seed):
            used = {int(codes[e]) for e in _batch_entities(batch)}
            assert used <= classes[split]
    # 5-way episodes of the 6 train classes only
    five = build_task_sampler(
        "nway_kshot", class_store, num_ways=5, num_shots=1, num_query=1, lookback=8
    )
    loader = BatchMetaDataLoader(five, part, batch_size=2, split="train", seed=seed)
    for batch in loader:
        assert {int(codes[e]) for e in _batch_entities(batch)} <= classes["train"]
    with pytest.raises(ValueError, match="split 'val': nway_kshot sampler: num_ways=5 but only 2"):
        BatchMetaDataLoader(five, part, batch_size=1, split="val")
    with pytest.raises(
        ValueError, match="the test split: nway_kshot sampler: num_ways=5 but only 2"
    ):
        five.for_evaluation(part.units("test"), split="test")


def test_class_split_needs_classes_for_every_share(class_store):
    sampler = build_task_sampler("nway_kshot", class_store, num_ways=2, lookback=8)
    # every split with a positive share gets at least one class
    tiny = build_partitioner(
        sampler, class_store, seed=0, fractions=(0.98, 0.01, 0.01), split_by="label"
    )
    assert [len(set(sampler.unit_classes()[tiny.units(s)])) for s in ("train", "val", "test")] == [
        8,
        1,
        1,
    ]
    # stratum classes: g0, g1 — two classes cannot fill three positive shares
    with pytest.raises(ValueError, match="data.split_by=stratum: 2 stratum classes"):
        build_partitioner(sampler, class_store, seed=0, split_by="stratum")
    with pytest.raises(ValueError, match="data.split_by must be one of"):
        build_partitioner(sampler, class_store, seed=0, split_by="colour")


def test_entity_split_stratified_by_label(class_store):
    sampler = build_task_sampler("forecast", class_store, lookback=8, horizon=4, num_support=2)
    part = build_partitioner(
        sampler, class_store, seed=0, fractions=(0.5, 0.25, 0.25), stratify_by="label"
    )
    labels = np.asarray(class_store.label_codes)[sampler.unit_entities()]
    for split, share in (("train", 2), ("val", 1), ("test", 1)):
        counts = np.bincount(labels[part.units(split)], minlength=10)
        assert (counts == share).all()  # 4 entities per class: 2 / 1 / 1


def test_sweep_style_pins_keep_test_classes(class_store):
    sampler = build_task_sampler("nway_kshot", class_store, num_ways=2, lookback=8)
    reference = build_partitioner(
        sampler, class_store, seed=11, split_by="label", fractions=(0.6, 0.2, 0.2)
    )
    test_classes = set(sampler.unit_classes()[reference.units("test")].tolist())
    pins = reference.units("test")[:1]  # one unit pins its whole class
    for seed in range(3):
        trial = build_partitioner(
            sampler,
            class_store,
            seed=seed,
            split_by="label",
            fractions=(0.6, 0.2, 0.2),
            pinned_test_units=pins,
        )
        got = set(sampler.unit_classes()[trial.units("test")].tolist())
        assert next(iter(sampler.unit_classes()[pins])) in got and len(got) == 2
    assert len(test_classes) == 2


def test_max_tasks_is_a_seeded_random_subset(encoded_store):
    sampler = _sampler("forecast", encoded_store)
    units = np.arange(sampler.num_units)
    first = sampler.for_evaluation(units, max_tasks=5, seed=1)
    again = sampler.for_evaluation(units, max_tasks=5, seed=1)
    other = sampler.for_evaluation(units, max_tasks=5, seed=2)

    def ids(tasks):
        return [e for b in tasks.batches(3, 0) for e in b.entity_index.tolist()]

    assert first.num_tasks == 5 and ids(first) == ids(again)
    assert ids(first) != ids(other)
    assert ids(first) != sampler.unit_entities()[:5].tolist()


def _whole_series_store(tmp_path, lengths, num_features):
    features = _class_panel(
        tmp_path / "panel.parquet",
        num_classes=2,
        per_class=3,
        lengths=lengths,
        num_features=num_features,
    )
    return ingest(
        tmp_path / "panel.parquet",
        tmp_path / "store",
        entity_col="entity",
        time_col="t",
        features=features,
        label_col="cls",
        scaling="none",
        progress=False,
    )


def test_whole_series_of_different_lengths_are_resampled(tmp_path):
    lengths = [5, 9, 3, 7, 4, 11]
    store = _whole_series_store(tmp_path, lengths, num_features=2)
    sampler = build_task_sampler(
        "nway_kshot", store, num_ways=2, num_shots=1, num_query=1, lookback=None, resample_to=5
    )
    batch = sampler.sample(np.arange(6), derive_task_seeds(0, 0, np.arange(6)))
    assert tuple(batch.support.x.shape) == (6, 2, 5, 2)  # [B, N*K, L, F]
    x = torch.cat([batch.support.x, batch.query.x], 1).reshape(-1, 5, 2).numpy()
    for example in x:
        e = int(example[0, 0]) // 10000
        n = lengths[e]
        position = np.linspace(0, n - 1, 5)  # row j at j*(n-1)/(L-1), interpolated
        np.testing.assert_allclose(example[:, 0], e * 10000 + position, rtol=0, atol=1e-3)
        np.testing.assert_allclose(example[:, 1], 2 * position, atol=1e-5)
    # default length: the longest series
    longest = build_task_sampler("nway_kshot", store, num_ways=2, num_shots=1, lookback=None)
    assert longest.lookback == 11
    one = longest.sample(np.arange(1), derive_task_seeds(0, 0, np.arange(1)))
    assert tuple(one.query.x.shape) == (1, 2, 11, 2)


def test_whole_equal_length_series_are_taken_as_they_are(tmp_path):
    store = _whole_series_store(tmp_path, [6] * 6, num_features=3)
    sampler = build_task_sampler("nway_kshot", store, num_ways=2, num_shots=1, lookback=None)
    batch = sampler.sample(np.arange(2), derive_task_seeds(0, 0, np.arange(2)))
    assert tuple(batch.support.x.shape) == (2, 2, 6, 3)
    for example in batch.support.x.reshape(-1, 6, 3).numpy():
        e = int(example[0, 0]) // 10000
        np.testing.assert_array_equal(example[:, 0], e * 10000 + np.arange(6))
        np.testing.assert_array_equal(example[:, 2], 3 * np.arange(6))


# A tiny 2-way 2-shot episode, one feature, windows of 3 steps.
_SUPPORT_X = torch.tensor([[[0.0, 1, 2], [0, 2, 4], [2, 1, 0], [3, 2, 2]]]).unsqueeze(-1)
_SUPPORT_Y = torch.tensor([[0, 0, 1, 1]])
_QUERY_X = torch.tensor([[[1.0, 2, 3.5], [5, 4, 3]]]).unsqueeze(-1)


def test_nearest_centroid_against_hand_computation():
    scores = baselines.nearest_centroid_scores(_SUPPORT_X, _SUPPORT_Y, _QUERY_X, 2)

    def z(v):
        v = np.asarray(v, float)
        return (v - v.mean()) / v.std()

    support = [z(v) for v in ([0, 1, 2], [0, 2, 4], [2, 1, 0], [3, 2, 2])]
    centroids = [(support[0] + support[1]) / 2, (support[2] + support[3]) / 2]
    for q, query in enumerate(([1, 2, 3.5], [5, 4, 3])):
        expected = [-((z(query) - c) ** 2).sum() for c in centroids]
        np.testing.assert_allclose(scores[0, q].numpy(), expected, rtol=1e-12)
    assert scores[0].argmax(-1).tolist() == [0, 1]


def test_one_nn_against_hand_computation():
    # query 0 = z[1, 2, 3.5]; nearest z-normalised support: [0,1,2] or [0,2,4] (both z = same
    # line), class 0; query 1 = z[5,4,3] equals z[2,1,0] exactly: class 1.
    scores = baselines.one_nn_scores(_SUPPORT_X, _SUPPORT_Y, _QUERY_X, 2)
    assert scores[0].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    flipped = baselines.one_nn_scores(_SUPPORT_X, 1 - _SUPPORT_Y, _QUERY_X, 2)
    assert flipped[0].tolist() == [[0.0, 1.0], [1.0, 0.0]]


def test_pretrained_embedding_centroids_use_the_backbone_features():
    # features = (first, last) value of each window: centroids (0, 3) and (2.5, 1)
    backbone = torch.nn.Sequential(torch.nn.Flatten(-2), torch.nn.Linear(3, 2))
    with torch.no_grad():
        backbone[1].weight.copy_(torch.tensor([[1.0, 0, 0], [0, 0, 1]]))
        backbone[1].bias.zero_()
    scores = baselines.embedding_centroid_scores(backbone, _SUPPORT_X, _SUPPORT_Y, _QUERY_X, 2)
    centroids = np.array([[0.0, 3.0], [2.5, 1.0]])
    for q, features in enumerate(([1.0, 3.5], [5.0, 3.0])):
        expected = -((np.asarray(features) - centroids) ** 2).sum(-1)
        np.testing.assert_allclose(scores[0, q].numpy(), expected, rtol=1e-6)


def test_pretraining_learns_the_meta_train_classes():
    torch.manual_seed(0)

    def examples(num, seed):
        g = torch.Generator().manual_seed(seed)
        y = torch.randint(0, 3, (num,), generator=g)
        x = torch.randn(num, 4, 1, generator=g) * 0.1 + y[:, None, None].float()
        return x, y

    backbone = torch.nn.Sequential(torch.nn.Flatten(-2), torch.nn.Linear(4, 8))
    trained = baselines.pretrain_embedding(
        backbone, examples, num_classes=3, embedding_size=8, steps=200, lr=0.05, batch_size=32
    )
    x, y = examples(60, 999)
    # nearest centroid of the learnt features separates the classes it was trained on
    support_x, support_y = x[:30].unsqueeze(0), y[:30].unsqueeze(0)
    scores = baselines.embedding_centroid_scores(
        trained, support_x, support_y, x[30:].unsqueeze(0), 3
    )
    assert (scores[0].argmax(-1) == y[30:]).float().mean() > 0.9
    with pytest.raises(ValueError, match="meta-train split has 1 class"):
        baselines.pretrain_embedding(
            backbone, examples, num_classes=1, embedding_size=8, steps=1, lr=0.1, batch_size=2
        )


@pytest.mark.integration
@pytest.mark.parametrize(
    "learner",
    [
        "protonet",
        "maml",
        "maml_pretrained",
        "maml_tune",
        "metabaseline",
        "metabaseline_ft",
        "metabaseline_adam",
        "metabaseline_tune",
    ],
)
def test_class_disjoint_run_is_scored_next_to_the_baselines(scaled_class_store, tmp_path, learner):
    from metadist.eval import evaluate_run
    from metadist.train.__main__ import main

    run_dir = tmp_path / "run"
    common = [
        f"experiment=ucr_{learner}",
        f"data.store={scaled_class_store.path}",
        f"run_dir={run_dir}",
        "sampler.options.num_ways=2",
        "sampler.options.num_query=2",
        "sampler.options.resample_to=16",
        "trainer.meta_steps=4",
        "trainer.meta_batch_size=2",
        "pretrain.steps=2",  # ucr_metabaseline pre-trains; a few steps do here
        "logging.progress=false",
        "logging.wandb.mode=disabled",
        "--no-eval",
    ]
    assert main(common) == 0
    result = evaluate_run(
        run_dir,
        overrides=["eval.scratch_steps=3", "eval.pretrain_steps=5", "eval.tasks_per_unit=2"],
        write=False,
    )
    expected = {"adapted", "scratch", "nearest_centroid", "one_nn", "pretrained", "baseline_pp"}
    if learner.startswith("maml"):
        expected.add("unadapted")
    assert set(result["overall"]) == expected
    # Meta-Baseline's pre-training (2 steps, the baseline's lr and batch size) is continued
    # to the baseline's 5; ucr_protonet pre-trains with other settings and MAML its head's
    # input features, so their baseline is a fresh network
    kept = torch.load(run_dir / "eval" / "pretrained_embedding.pt", weights_only=True)
    forked = learner.startswith("metabaseline")
    assert kept["settings"].get("forked_at") == (2 if forked else None)
    assert kept["settings"]["steps"] == 5
    assert result["num_tasks"] == 2 * 20  # 5 test classes of 4 entities, 2 episodes each
    assert "20 test units, 2 tasks each" in result["settings"]["tasks"]
    assert "(2-way " in result["settings"]["tasks"]  # the episodes, then the classes
    assert "-shot, 2 query per class, from 5 label classes)" in result["settings"]["tasks"]
    assert result["diverged"] == {}, result["diverged"]
    for method in expected:
        assert 0.0 <= result["overall"][method]["accuracy"]["value"] <= 1.0


def test_sweep_trials_resplit_classes_with_the_test_classes_pinned(class_store):
    from metadist.launch.sweep import compute_split
    from metadist.train.compose import load_config

    def split_of(seed):
        config = load_config(
            [
                "experiment=ucr_protonet",
                f"data.store={class_store.path}",
                "data.fractions=[0.6,0.2,0.2]",
                "sampler.options.num_ways=2",
                "sampler.options.num_query=1",
                f"trainer.seed={seed}",
            ],
            world_size=1,
        )
        split = compute_split(config, test_seed=5)
        codes = np.asarray(class_store.label_codes)
        classes = {k: set(codes[split[k]].tolist()) for k in ("train", "val", "test")}
        return split, classes

    (first, a), (second, b) = split_of(0), split_of(1)
    assert a["test"] == b["test"] and len(a["test"]) == 2
    assert first["test"] == second["test"]
    assert len(first["pins"]) == 2  # one unit pins each meta-test class
    for classes in (a, b):
        assert not (classes["train"] & classes["test"]) and not (classes["val"] & classes["test"])
        assert not classes["train"] & classes["val"]
    assert (a["train"], a["val"]) != (b["train"], b["val"])


def _pretrain_run(store, run_dir, learner, *extra):
    from metadist.train import load_config, train

    config = load_config(
        [
            f"experiment=ucr_{learner}",
            f"data.store={store.path}",
            f"run_dir={run_dir}",
            "sampler.options.num_ways=2",
            "sampler.options.num_query=2",
            "sampler.options.resample_to=16",
            "trainer.meta_steps=2",
            "trainer.meta_batch_size=2",
            "logging.progress=false",
            "logging.wandb.mode=disabled",
            "pretrain.batch_size=8",
            "pretrain.save_every=2",
            *extra,
        ],
        world_size=1,
    )
    return train(config)


@pytest.mark.integration
@pytest.mark.parametrize("learner", ["metabaseline", "maml"])
def test_pretraining_phase_runs_first_and_resumes_exactly(scaled_class_store, tmp_path, learner):
    import shutil

    from metadist.train import latest_checkpoint_state

    straight = _pretrain_run(scaled_class_store, tmp_path / "a", learner, "pretrain.steps=6")
    state = torch.load(tmp_path / "a" / "pretrain.pt", weights_only=True)
    assert state["step"] == 6
    _pretrain_run(scaled_class_store, tmp_path / "plain", learner, "pretrain.steps=0")
    assert not (tmp_path / "plain" / "pretrain.pt").exists()
    differs = [
        name
        for name, value in latest_checkpoint_state(tmp_path / "a")["learner"].items()
        if not torch.equal(value, latest_checkpoint_state(tmp_path / "plain")["learner"][name])
    ]
    assert differs  # the phase changed the weights meta-training started from
    if learner == "maml":  # the head was set aside and put back: still the learner's own
        assert straight.learner.model.head.weight.shape[0] == 2

    # A run killed after 2 pre-training steps (its state saved, no checkpoint yet) goes on
    # from step 2 and ends exactly where the uninterrupted run did.
    _pretrain_run(scaled_class_store, tmp_path / "b", learner, "pretrain.steps=2")
    shutil.rmtree(tmp_path / "b" / "checkpoints")
    _pretrain_run(scaled_class_store, tmp_path / "b", learner, "pretrain.steps=6")
    a, b = (latest_checkpoint_state(tmp_path / r)["learner"] for r in ("a", "b"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_pretraining_needs_labelled_examples(tmp_path):
    from metadist.train import load_config, train

    config = load_config(
        ["experiment=sinusoid_maml", f"run_dir={tmp_path / 'r'}", "pretrain.steps=5"],
        world_size=1,
    )
    with pytest.raises(ValueError, match="pretrain.steps=5: sampler 'sinusoid' gives no"):
        train(config)


def test_a_set_with_too_few_classes_names_the_real_levers(tmp_path):
    from metadist.train import load_config, train

    _class_panel(tmp_path / "panel.parquet", num_classes=3, per_class=6)
    store = ingest(
        tmp_path / "panel.parquet",
        tmp_path / "store",
        entity_col="entity",
        time_col="t",
        features=["code"],
        targets=["code"],
        label_col="cls",
        scaling="per-entity",
    )
    config = load_config(
        ["experiment=ucr_protonet", f"data.store={store.path}", f"run_dir={tmp_path / 'r'}"],
        world_size=1,
    )
    with pytest.raises(ValueError) as refused:
        train(config)
    message = str(refused.value)
    # split by unit (auto, with 3 classes), each class short of examples: that lever first
    assert message.startswith("the meta-train split cannot give tasks: ")
    assert "3 of its classes have fewer than num_shots + num_query examples: lower " in message
    assert "meta_batch_size" not in message and "split_by" not in message  # cannot help here
    config.data.split_by = "label"  # class-disjoint: a split short of classes, that lever
    config.sampler.options["num_shots"], config.sampler.options["num_query"] = 1, 1
    with pytest.raises(ValueError) as refused:
        train(config)
    message = str(refused.value)
    assert "holds 1 of the store's 3 label classes: use data.split_by=unit" in message
