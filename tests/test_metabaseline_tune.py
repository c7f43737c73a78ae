"""Meta-Baseline with the embedding tuned at evaluation: each task's network and head
against the task fine-tuned alone by `torch.optim.Adam`, meta-training = metabaseline_adam,
label-order invariance, and the option's error."""

import copy

import pytest
import torch
import torch.nn.functional as F
from test_metabaseline import episodes
from test_metabaseline_ft import in_float64

from metadist.learners import build_learner
from metadist.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


def learner_and_model(dtype=torch.float32, name="metabaseline_tune", **options):
    torch.manual_seed(0)
    model = build_model("mlp", (6, 2), (4,), hidden_sizes=(8,)).to(dtype)
    return build_learner(name, model, **options), model


def tuned_by_hand(model, scale, sizes, embedding_lr, support_x, support_y, query_x, num_ways):
    """One task's query logits `[Q, N]`: a copy of the network and its unit-length
    prototypes trained together by `torch.optim.Adam` (the head at `sizes[t]`, the
    network at `embedding_lr`) on the support cross-entropy of `scale · cos(f(x), w_c)`."""
    network = copy.deepcopy(model)
    with torch.no_grad():
        features = network(support_x)
        weights = torch.stack([features[support_y == c].mean(0) for c in range(num_ways)])
    weights = (weights / weights.norm(dim=-1, keepdim=True)).requires_grad_(True)
    optimizer = torch.optim.Adam(
        [{"params": [weights], "lr": sizes[0]}, {"params": list(network.parameters())}],
        lr=embedding_lr,
        foreach=False,
    )
    for size in sizes:
        optimizer.param_groups[0]["lr"] = size
        optimizer.zero_grad()
        features = network(support_x)
        logits = scale * F.cosine_similarity(features[:, None, :], weights[None], dim=-1)
        F.cross_entropy(logits, support_y).backward()
        optimizer.step()
    with torch.no_grad():
        query = network(query_x)
        return scale * F.cosine_similarity(query[:, None, :], weights[None], dim=-1)


def test_each_task_tunes_its_own_network_and_head_as_torch_adam_does():
    learner, model = learner_and_model(dtype=torch.float64, inner_steps=3, embedding_lr=0.02)
    sizes = [0.05, 0.02, 0.1]
    with torch.no_grad():
        learner.log_inner_lrs.copy_(torch.tensor(sizes, dtype=torch.float64).log())
    batch = in_float64(episodes(num_shots=2))
    before = [p.clone() for p in model.parameters()]
    with torch.no_grad():
        params = learner.adapt(batch.support)
        logits = learner.predict(params, batch.query.x)
    for b in range(3):
        expected = tuned_by_hand(
            model,
            10.0,
            sizes,
            0.02,
            batch.support.x[b],
            batch.support.y[b],
            batch.query.x[b],
            3,
        )
        torch.testing.assert_close(logits[b], expected, rtol=1e-9, atol=1e-9)
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))
    # the network moved: the head alone gives other logits
    adam, _ = learner_and_model(dtype=torch.float64, name="metabaseline_adam", inner_steps=3)
    adam.load_state_dict(learner.state_dict())
    with torch.no_grad():
        head_only = adam.predict(adam.adapt(batch.support), batch.query.x)
    assert (head_only - logits).abs().max() > 1e-3


def test_meta_training_is_metabaseline_adams():
    batch = episodes()
    tune, _ = learner_and_model(inner_steps=4)
    adam, _ = learner_and_model(name="metabaseline_adam", inner_steps=4)
    torch.testing.assert_close(tune(batch).loss, adam(batch).loss, rtol=0, atol=0)
    assert set(tune.adapt(batch.support)) == {"prototypes"}  # with gradient: the head only
    with torch.no_grad():
        no_steps = tune.predict(tune.adapt(batch.support, steps=0), batch.query.x)
        torch.testing.assert_close(
            no_steps, adam.predict(adam.adapt(batch.support, steps=0), batch.query.x)
        )


def test_bad_embedding_lr_names_the_field():
    with pytest.raises(ValueError, match="learner 'metabaseline_tune': embedding_lr"):
        learner_and_model(embedding_lr=0.0)
