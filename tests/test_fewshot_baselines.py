"""Few-shot baselines as strong as the literature's: Baseline++ (a cosine classifier
fine-tuned on each support set over a frozen pretrained backbone), whole cases
z-normalised before they are resampled, and every baseline's predictions independent of
what the ways are called."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.nn import functional

from metadist.api.classification import classifier_inputs
from metadist.batch import MetaBatch, TaskSet
from metadist.eval import baselines
from metadist.eval.baseline_pp import cosine_classifier_scores
from metadist.eval.classification_scoring import classification_baselines
from metadist.store import ingest
from metadist.tasks import build_task_sampler, derive_task_seeds
from metadist.tasks.inference import classify_windows, protocol_attributes

NUM_WAYS = 3


pytestmark = pytest.mark.usefixtures("one_thread")


def _backbone(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(-2), torch.nn.Linear(6, 5)).eval()


def _episodes(num_tasks=4, shots=2, query=3, seed=0):
    """Way-major episodes of `[6, 1]` examples whose level and slope follow the class."""
    g = torch.Generator().manual_seed(seed)

    def side(k):
        y = torch.arange(NUM_WAYS).repeat_interleave(k).repeat(num_tasks, 1)
        ramp = torch.linspace(0, 1, 6)
        x = torch.randn(num_tasks, NUM_WAYS * k, 6, generator=g) * 0.3
        x = x + y[..., None] * 0.7 + (y[..., None] - 1) * ramp
        return TaskSet(x.unsqueeze(-1), y)

    return MetaBatch(
        support=side(shots),
        query=side(query),
        entity_index=torch.full((num_tasks,), -1),
        stratum=torch.zeros(num_tasks, dtype=torch.int64),
        split_time=torch.full((num_tasks,), -1),
    )


def test_baseline_pp_without_fine_tuning_is_the_scaled_cosine_centroid():
    batch, backbone = _episodes(), _backbone()
    scores = cosine_classifier_scores(
        backbone, batch.support.x, batch.support.y, batch.query.x, NUM_WAYS, steps=0
    )
    with torch.no_grad():  # an independent computation, episode by episode
        for b in range(batch.num_tasks):
            support = functional.normalize(backbone(batch.support.x[b]).double(), dim=-1)
            query = functional.normalize(backbone(batch.query.x[b]).double(), dim=-1)
            centroids = torch.stack([support[batch.support.y[b] == c].mean(0) for c in range(3)])
            expected = 10.0 * functional.cosine_similarity(query[:, None], centroids[None], dim=-1)
            torch.testing.assert_close(scores[b], expected, rtol=1e-9, atol=1e-9)


def test_baseline_pp_fits_each_support_set_alone():
    batch, backbone = _episodes(), _backbone()
    args = (backbone, batch.support.x, batch.support.y)
    before = cosine_classifier_scores(*args, batch.support.x, NUM_WAYS, steps=0)
    after = cosine_classifier_scores(*args, batch.support.x, NUM_WAYS)
    loss = [
        functional.cross_entropy(s.reshape(-1, 3), batch.support.y.reshape(-1))
        for s in (before, after)
    ]
    assert loss[1] < 0.5 * loss[0]  # fine-tuning fits the support set
    assert (after.argmax(-1) == batch.support.y).all()
    # each episode's training is its own: alone, it scores the same as in the batch
    queries = cosine_classifier_scores(*args, batch.query.x, NUM_WAYS)
    for b in (0, 3):
        alone = cosine_classifier_scores(
            backbone,
            batch.support.x[b : b + 1],
            batch.support.y[b : b + 1],
            batch.query.x[b : b + 1],
            NUM_WAYS,
        )
        torch.testing.assert_close(alone[0], queries[b], rtol=1e-6, atol=1e-6)
    # the backbone is frozen
    assert all(p.grad is None for p in backbone.parameters())


def test_baseline_pp_refuses_bad_settings():
    batch = _episodes(num_tasks=1)
    with pytest.raises(ValueError, match="Baseline\\+\\+: steps"):
        cosine_classifier_scores(
            _backbone(), batch.support.x, batch.support.y, batch.query.x, 3, lr=0.0
        )


def _relabelled(batch, permutation):
    return MetaBatch(
        support=TaskSet(batch.support.x, permutation[batch.support.y]),
        query=TaskSet(batch.query.x, permutation[batch.query.y]),
        entity_index=batch.entity_index,
        stratum=batch.stratum,
        split_time=batch.split_time,
    )


@pytest.mark.parametrize("normalised", [False, True])
def test_no_baseline_prediction_depends_on_the_names_of_the_ways(normalised):
    batch, backbone = _episodes(shots=1), _backbone()
    scores = classification_baselines(batch, backbone, normalised)
    assert set(scores) == {"nearest_centroid", "one_nn", "pretrained", "baseline_pp"}
    for permutation in (torch.tensor([2, 0, 1]), torch.tensor([1, 0, 2])):
        moved = classification_baselines(_relabelled(batch, permutation), backbone, normalised)
        for method, values in scores.items():
            # way c of the episode is way permutation[c] of the relabelled one
            predicted = permutation[values.argmax(-1)]
            assert torch.equal(moved[method].argmax(-1), predicted), method
            torch.testing.assert_close(
                moved[method][..., permutation], values, rtol=1e-6, atol=1e-6
            )


def test_raw_baselines_take_case_normalised_examples_as_they_are():
    batch = _episodes()
    args = (batch.support.x, batch.support.y, batch.query.x, NUM_WAYS)
    flat = batch.query.x.reshape(4, 9, -1).double()
    supports = batch.support.x.reshape(4, 6, -1).double()
    as_is = baselines.nearest_centroid_scores(*args, normalise=False)
    centroids = supports.reshape(4, 3, 2, -1).mean(2)
    torch.testing.assert_close(as_is, -torch.cdist(flat, centroids).pow(2))
    nearest = torch.cdist(flat, supports).argmin(-1)
    assert torch.equal(
        baselines.one_nn_scores(*args, normalise=False).argmax(-1),
        batch.support.y.gather(1, nearest),
    )
    assert not torch.allclose(as_is, baselines.nearest_centroid_scores(*args))


def _case_store(tmp_path, lengths):
    """Cases of 3 classes, lengths `lengths`, feature 0 a ramp at a per-case level and scale."""
    entity, step, value, other = [], [], [], []
    for e, n in enumerate(lengths):
        t = np.arange(n, dtype=np.float64)
        entity += [f"e{e:02d}"] * n
        step += t.astype(np.int64).tolist()
        value += (5.0 * e + (e % 4 + 1) * np.sin(t + e)).tolist()
        other += (t**2 - e).tolist()
    table = pa.table(
        {
            "entity": entity,
            "t": pa.array(step, pa.int64()),
            "a": value,
            "b": other,
            "cls": [f"c{int(e[1:]) % 3}" for e in entity],
        }
    )
    pq.write_table(table, tmp_path / "panel.parquet")
    return ingest(
        tmp_path / "panel.parquet",
        tmp_path / "store",
        entity_col="entity",
        time_col="t",
        features=["a", "b"],
        label_col="cls",
        scaling="none",
        progress=False,
    )


def test_z_normalise_scales_each_whole_case_before_it_is_resampled(tmp_path):
    lengths = [5, 9, 13, 7, 4, 11, 6, 8, 10]
    store = _case_store(tmp_path, lengths)
    options = {"num_ways": 3, "num_shots": 1, "num_query": 1, "lookback": None}
    sampler = build_task_sampler("nway_kshot", store, resample_to=16, z_normalise=True, **options)
    raw = build_task_sampler("nway_kshot", store, resample_to=16, **options)
    seeds = derive_task_seeds(0, 0, np.arange(9))
    batch, unscaled = sampler.sample(np.arange(9), seeds), raw.sample(np.arange(9), seeds)
    values = np.asarray(store.values, dtype=np.float64)
    starts = np.asarray(store.starts)
    x = torch.cat([batch.support.x, batch.query.x], 1).reshape(-1, 16, 2).double().numpy()
    y = torch.cat([unscaled.support.x, unscaled.query.x], 1).reshape(-1, 16, 2).double().numpy()
    for example, resampled in zip(x, y, strict=True):
        # which case: the unscaled example's first row is that case's first row
        e = int(np.flatnonzero(np.isclose(values[starts, 0], resampled[0, 0]))[0])
        case = values[starts[e] : starts[e] + lengths[e]]
        z = (case - case.mean(0)) / case.std(0)  # the whole case, before resampling
        position = np.linspace(0, lengths[e] - 1, 16)
        for f in range(2):
            expected = np.interp(position, np.arange(lengths[e]), z[:, f])
            np.testing.assert_allclose(example[:, f], expected, rtol=0, atol=1e-5)
    tasks = sampler.for_evaluation(np.arange(9), split="test")
    assert tasks.examples_normalised and not raw.for_evaluation(np.arange(9)).examples_normalised
    assert math.isclose(float(x[..., 0].mean()), 0.0, abs_tol=0.2)  # not the resampled grid's


def test_a_run_classifies_new_cases_normalised_as_its_sampler_did(tmp_path):
    lengths = [5, 9, 13, 7, 4, 11]
    store = _case_store(tmp_path, lengths)
    sampler = build_task_sampler(
        "nway_kshot", store, num_ways=2, num_shots=1, lookback=None, resample_to=8, z_normalise=True
    )
    windows = classify_windows(sampler)
    assert windows.z_normalise and windows.resample
    assert protocol_attributes(sampler)["z_normalise"] is True  # what a run records
    values, starts = np.asarray(store.values), np.asarray(store.starts)
    cases = [values[s : s + n] for s, n in zip(starts, lengths, strict=True)]
    given = classifier_inputs(windows, store, cases, "examples")
    units = np.arange(len(lengths))
    expected = sampler._gather(starts[units], units)  # what training and evaluation read
    np.testing.assert_allclose(given, expected, rtol=0, atol=1e-5)
