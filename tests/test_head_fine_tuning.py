"""What every learner that fine-tunes Meta-Baseline's cosine head per support set
(`learners.head_fine_tuning`: `metabaseline_ft`, `metabaseline_adam`, `metabaseline_tune`)
owes: relabelling the ways permutes the logits, and no steps is Meta-Baseline."""

import pytest
import torch
from test_metabaseline import episodes
from test_metabaseline_ft import in_float64
from test_shared_head import relabelled

from metadist.learners import build_learner
from metadist.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

# each learner's options in these tests (metabaseline_tune: fewer whole-network steps)
HEAD_TUNERS = {
    "metabaseline_ft": {},
    "metabaseline_adam": {},
    "metabaseline_tune": {"inner_steps": 5},
}


def learner_and_model(name, dtype=torch.float32):
    torch.manual_seed(0)
    model = build_model("mlp", (6, 2), (4,), hidden_sizes=(8,)).to(dtype)
    return build_learner(name, model, **HEAD_TUNERS[name]), model


@pytest.mark.parametrize("name", sorted(HEAD_TUNERS))
def test_relabelling_the_ways_permutes_the_logits(name):
    learner, _ = learner_and_model(name, dtype=torch.float64)
    batch = in_float64(episodes(num_shots=2, seed=5))
    with torch.no_grad():
        logits = learner.predict(learner.adapt(batch.support), batch.query.x)
        for permutation in (torch.tensor([2, 0, 1]), torch.tensor([1, 0, 2])):
            moved = relabelled(batch, permutation)
            # way c of the episode is way permutation[c] of the relabelled one
            other = learner.predict(learner.adapt(moved.support), moved.query.x)
            torch.testing.assert_close(other[..., permutation], logits, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", sorted(HEAD_TUNERS))
def test_no_steps_is_meta_baseline(name):
    learner, model = learner_and_model(name)
    plain = build_learner("metabaseline", model)
    batch = episodes()
    with torch.no_grad():
        ours = learner.predict(learner.adapt(batch.support, steps=0), batch.query.x)
        theirs = plain.predict(plain.adapt(batch.support), batch.query.x)
        torch.testing.assert_close(ours, theirs)
        # and the default steps change the logits: the equality is not trivial
        tuned = learner.predict(learner.adapt(batch.support), batch.query.x)
    assert (tuned - ours).abs().max() > 1e-3
