"""Meta-Baseline: scaled cosine logits against an independent computation, the learned
scale, and a few training steps that fit a small classification problem."""

import pytest
import torch
import torch.nn.functional as F

from metadist.batch import MetaBatch, TaskSet
from metadist.learners import build_learner, get_learner
from metadist.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


def episodes(num_tasks=3, num_ways=3, num_shots=2, num_query=2, seed=0):
    """Way-major episodes of `[6, 2]` windows whose class shifts their level."""
    g = torch.Generator().manual_seed(seed)

    def side(k):
        y = torch.arange(num_ways).repeat_interleave(k).repeat(num_tasks, 1)
        x = torch.randn(num_tasks, num_ways * k, 6, 2, generator=g) + y[..., None, None] * 0.7
        return TaskSet(x, y)

    support, query = side(num_shots), side(num_query)
    return MetaBatch(
        support=support,
        query=query,
        entity_index=torch.full((num_tasks,), -1),
        stratum=torch.zeros(num_tasks, dtype=torch.int64),
        split_time=torch.full((num_tasks,), -1),
    )


def learner_and_model(**options):
    torch.manual_seed(0)
    model = build_model("mlp", (6, 2), (4,), hidden_sizes=(8,))
    return build_learner("metabaseline", model, **options), model


def test_logits_are_the_scaled_cosine_to_the_class_means():
    learner, model = learner_and_model(init_scale=7.5)
    batch = episodes()
    with torch.no_grad():
        logits = learner.predict(learner.adapt(batch.support), batch.query.x)
        assert logits.shape == (3, 6, 3)
        for b in range(3):
            support = model(batch.support.x[b])  # one task at a time, plain model calls
            query = model(batch.query.x[b])
            for c in range(3):
                prototype = support[batch.support.y[b] == c].mean(0)
                for q in range(6):
                    expected = 7.5 * F.cosine_similarity(query[q], prototype, dim=0)
                    torch.testing.assert_close(logits[b, q, c], expected, rtol=1e-5, atol=1e-5)


def test_the_loss_is_the_cross_entropy_of_those_logits_and_the_scale_learns():
    learner, model = learner_and_model()
    batch = episodes()
    out = learner(batch)
    logits = learner.predict(learner.adapt(batch.support), batch.query.x)
    expected = F.cross_entropy(logits.reshape(-1, 3), batch.query.y.reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    assert set(out.metrics) == {"query_loss_after", "query_accuracy_after"}
    out.loss.backward()
    assert learner.scale.grad is not None and learner.scale.grad.abs() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert "scale" in learner.state_dict()


def test_a_fixed_scale_gets_no_gradient():
    learner, _ = learner_and_model(init_scale=3.0, learn_scale=False)
    learner(episodes()).loss.backward()
    assert not learner.scale.requires_grad and learner.scale.grad is None
    assert learner.scale.item() == 3.0


def test_it_has_no_inner_loop_and_moves_with_the_module():
    learner, _ = learner_and_model()
    assert get_learner("metabaseline").has_inner_loop is False
    assert learner.double().scale.dtype == torch.float64


def test_a_few_training_steps_lower_the_loss():
    learner, _ = learner_and_model()
    optimizer = torch.optim.Adam(learner.parameters(), lr=0.01)
    held_out = episodes(num_tasks=8, seed=99)
    with torch.no_grad():
        before = learner(held_out).loss.item()
    for step in range(30):
        optimizer.zero_grad()
        learner(episodes(num_tasks=4, seed=step)).loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = learner(held_out).loss.item()
    assert after < 0.7 * before, (before, after)


@pytest.mark.parametrize(
    ("options", "field"),
    [({"init_scale": 0.0}, "init_scale"), ({"learn_scale": "yes"}, "learn_scale")],
)
def test_bad_options_name_the_field(options, field):
    with pytest.raises(ValueError, match=field):
        learner_and_model(**options)


def test_errors_name_the_learner():
    with pytest.raises(ValueError, match="learner 'metabaseline': loss must be 'cross_entropy'"):
        learner_and_model(loss="mse")
