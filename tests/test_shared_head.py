"""The shared head (Unicorn-MAML): every way starts from one row, so the adapted
predictions follow the way labels; and every registered learner classifies the same
whatever order the labels of an episode come in."""

import pytest
import torch
from torch import nn

from metadist.batch import MetaBatch, TaskSet
from metadist.learners import build_learner, get_learner, registered_learners
from metadist.learners.heads import SharedRowLinear
from metadist.models import build_model

NUM_WAYS = 4


pytestmark = pytest.mark.usefixtures("one_thread")


def episodes(num_tasks=3, num_shots=2, num_query=3, seed=0, dtype=torch.float32):
    """Way-major N-way episodes of `[8, 2]` windows whose class shifts their level."""
    g = torch.Generator().manual_seed(seed)

    def side(k):
        y = torch.arange(NUM_WAYS).repeat_interleave(k).repeat(num_tasks, 1)
        x = torch.randn(num_tasks, NUM_WAYS * k, 8, 2, generator=g, dtype=dtype)
        return TaskSet(x + y[..., None, None] * 0.5, y)

    support, query = side(num_shots), side(num_query)
    return MetaBatch(
        support=support,
        query=query,
        entity_index=torch.full((num_tasks,), -1),
        stratum=torch.zeros(num_tasks, dtype=torch.int64),
        split_time=torch.full((num_tasks,), -1),
    )


def relabelled(batch, permutation):
    """The same episodes with way c called `permutation[c]` in support and query."""
    return MetaBatch(
        support=TaskSet(batch.support.x, permutation[batch.support.y]),
        query=TaskSet(batch.query.x, permutation[batch.query.y]),
        entity_index=batch.entity_index,
        stratum=batch.stratum,
        split_time=batch.split_time,
    )


def classifier(model_name="tcn", output=NUM_WAYS):
    torch.manual_seed(1)
    options = {
        "tcn": {"channels": 4, "num_levels": 2, "pool": "mean"},
        "mlp": {"hidden_sizes": (8,)},
    }[model_name]
    return build_model(model_name, (8, 2), (output,), **options)


# What each inner-loop learner is built with here: `fomaml` is maml's first-order option.
INNER_LOOP = {
    "maml": ("maml", {}),
    "fomaml": ("maml", {"first_order": True}),
    "metasgd": ("metasgd", {}),
    "anil": ("anil", {}),
    # MAML++: learned per-step, per-layer rates, multi-step loss, annealed first order
    "maml++": (
        "maml",
        {
            "learn_inner_lr": True,
            "inner_lr_per_layer": True,
            "multi_step_loss_steps": 5,
            "first_order_steps": 1,
        },
    ),
}


def inner_loop_learner(key, model, **options):
    name, own = INNER_LOOP[key]
    options = {"loss": "cross_entropy", "inner_steps": 2, "inner_lr": 0.5, **own, **options}
    return build_learner(name, model, **options)


def meta_train(learner, steps=3):
    """A few outer steps, so the learned state (rows, step sizes) is not its init."""
    optimizer = torch.optim.Adam(learner.parameters(), lr=0.05)
    for step in range(steps):
        optimizer.zero_grad()
        learner(episodes(seed=100 + step)).loss.backward()
        optimizer.step()


def adapted_logits(learner, batch):
    with torch.no_grad():
        return learner.predict(learner.adapt(batch.support), batch.query.x)


PERMUTATION = torch.tensor([2, 0, 3, 1])


@pytest.mark.parametrize("model_name", ["tcn", "mlp"])
@pytest.mark.parametrize("key", sorted(INNER_LOOP))
def test_permuting_the_labels_permutes_the_logits_columns(key, model_name):
    learner = inner_loop_learner(key, classifier(model_name), shared_head=True)
    meta_train(learner)
    if key == "metasgd":  # learned step sizes, different in every entry of the shared row
        with torch.no_grad():
            for rate in learner.inner_lrs.values():
                rate.uniform_(0.1, 0.9)
    if key == "maml++":  # a different rate for every step and layer
        with torch.no_grad():
            learner.inner_lrs.uniform_(0.1, 0.9)
    learner.eval()
    batch = episodes()
    logits = adapted_logits(learner, batch)
    permuted = adapted_logits(learner, relabelled(batch, PERMUTATION))
    # way c of the original episode is way PERMUTATION[c] of the relabelled one
    torch.testing.assert_close(permuted[..., PERMUTATION], logits, rtol=0, atol=1e-5)
    assert logits.std(-1).mean() > 1e-2  # the ways are told apart: not a trivial equality

    plain = inner_loop_learner(key, classifier(model_name))  # the same without the option
    plain.eval()
    moved = adapted_logits(plain, relabelled(batch, PERMUTATION))[..., PERMUTATION]
    assert (moved - adapted_logits(plain, batch)).abs().max() > 1e-2


def _classify(learner, batch):
    """The predicted class of every query example after adapting on the support set."""
    learner.eval()
    return adapted_logits(learner, batch).argmax(-1)


# Learners with an inner loop depend on the label order through their head's initial rows
# unless shared_head is on (maml, metasgd, anil, reptile: they run with it); prototype
# learners (protonet, metabaseline: no inner loop) are invariant as they are.
@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.parametrize("name", registered_learners())
def test_every_learner_classifies_the_same_whatever_the_label_order(name, trained):
    batch = episodes()
    if get_learner(name).has_inner_loop:
        options = {"loss": "cross_entropy", "inner_steps": 2, "inner_lr": 0.5, "shared_head": True}
        learner = build_learner(name, classifier(), **options)
    else:
        learner = build_learner(name, classifier(output=6))  # an embedding
    if trained:  # its learned state moved off its initialisation
        meta_train(learner)
    predicted = _classify(learner, batch)
    assert predicted.unique().numel() > 1  # not one class for every query: not trivial
    for permutation in (PERMUTATION, torch.tensor([3, 2, 1, 0])):
        relabelled_predictions = _classify(learner, relabelled(batch, permutation))
        assert torch.equal(relabelled_predictions, permutation[predicted])


def test_the_head_becomes_one_shared_row_whose_ways_start_alike():
    model = classifier()
    rows = model.head.weight.detach().clone()
    learner = inner_loop_learner("maml", model, shared_head=True)
    assert isinstance(model.head, SharedRowLinear)
    assert model.head.weight.shape == (4,) and model.head.bias.shape == ()
    torch.testing.assert_close(model.head.weight.detach(), rows.mean(0))
    batch = episodes()
    unadapted = model(batch.query.x)  # the model's own forward: all ways equal
    assert torch.equal(unadapted, unadapted[..., :1].expand_as(unadapted))
    params = learner.adapt(batch.support, steps=0)
    assert params["head.weight"].shape == (3, NUM_WAYS, 4)
    torch.testing.assert_close(learner.predict(params, batch.query.x), unadapted)
    out = learner(batch)  # the unadapted metrics score the shared head: chance level
    torch.testing.assert_close(
        out.metrics["query_loss_before"], torch.log(torch.tensor(float(NUM_WAYS)))
    )
    # a second learner on the same model keeps its shared head
    again = inner_loop_learner("anil", model, shared_head=True)
    assert again.shared_head == ("head", NUM_WAYS) and model.head.weight.shape == (4,)


def test_the_shared_row_gets_no_meta_gradient_from_cross_entropy():
    """Softmax cancels what the rows share (see learners/heads.py): the body learns, the
    shared row and bias do not move."""
    model = classifier()
    learner = inner_loop_learner("maml", model, shared_head=True)
    learner(episodes()).loss.backward()
    assert model.head.weight.grad.abs().max() < 1e-6
    assert model.head.bias.grad.abs() < 1e-6
    assert model.body[0].conv.weight.grad.abs().max() > 1e-4


def test_metasgd_learns_one_step_size_per_entry_of_the_shared_row():
    learner = inner_loop_learner("metasgd", classifier(), shared_head=True)
    assert learner.inner_lrs["head__weight"].shape == (4,)
    assert learner.inner_lrs["head__bias"].shape == ()


@pytest.mark.parametrize("model_name", ["tcn", "mlp"])
def test_batched_equals_the_loop_with_a_shared_head(model_name):
    results = []
    for vectorize in (True, False):
        model = classifier(model_name)
        learner = inner_loop_learner("maml", model, shared_head=True, vectorize=vectorize)
        out = learner(episodes())
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in learner.named_parameters()}
        results.append((out, grads, adapted_logits(learner, episodes(seed=5))))
    (out_v, grads_v, logits_v), (out_l, grads_l, logits_l) = results
    torch.testing.assert_close(out_v.loss, out_l.loss, rtol=1e-6, atol=1e-6)
    for key in out_l.metrics:
        torch.testing.assert_close(out_v.metrics[key], out_l.metrics[key], rtol=1e-6, atol=1e-6)
    for key in grads_l:
        torch.testing.assert_close(grads_v[key], grads_l[key], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits_v, logits_l, rtol=1e-5, atol=1e-5)


def test_second_order_meta_gradient_through_the_shared_head_is_exact():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(-2), nn.Linear(16, 3), nn.Tanh(), nn.Linear(3, NUM_WAYS))
    learner = build_learner(
        "maml", model.double(), loss="cross_entropy", inner_lr=0.5, shared_head=True
    )
    assert learner.shared_head == ("3", NUM_WAYS)  # the last child with parameters
    batch = episodes(num_tasks=2, num_shots=1, num_query=1, dtype=torch.float64)
    learner(batch).loss.backward()
    analytic = {n: p.grad.clone() for n, p in learner.named_parameters()}
    eps = 1e-6
    with torch.no_grad():
        for name, p in learner.named_parameters():
            for i in range(p.numel()):
                original = p.view(-1)[i].item()
                p.view(-1)[i] = original + eps
                plus = learner(batch).loss.item()
                p.view(-1)[i] = original - eps
                minus = learner(batch).loss.item()
                p.view(-1)[i] = original
                numeric = (plus - minus) / (2 * eps)
                assert abs(analytic[name].view(-1)[i].item() - numeric) < 1e-6, (name, i)


def test_a_trained_state_loads_into_a_fresh_learner():
    """What evaluation does: build the learner on a fresh model, load the state dict."""
    trained = inner_loop_learner("maml", classifier(), shared_head=True)
    meta_train(trained)
    fresh = inner_loop_learner("maml", classifier(), shared_head=True)
    fresh.load_state_dict(trained.state_dict())
    batch = episodes(seed=7)
    torch.testing.assert_close(adapted_logits(fresh, batch), adapted_logits(trained, batch))


def test_a_head_that_is_not_linear_is_refused():
    model = classifier()
    model.head = nn.Sequential(nn.Linear(4, NUM_WAYS))
    with pytest.raises(ValueError, match="shared_head needs the model's head 'head' to be an"):
        build_learner("maml", model, loss="cross_entropy", shared_head=True)
