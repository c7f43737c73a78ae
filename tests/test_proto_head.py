"""Proto-MAML's head (`learners/proto_head.py`): each task's rows start at its support
prototypes over L2-normalised features, the inner loop then adapts the rows as
parameters of their own, and the options are checked."""

import pytest
import torch
import torch.nn.functional as F
from test_shared_head import NUM_WAYS, PERMUTATION, classifier, episodes, relabelled
from torch.func import functional_call

from metadist.learners import build_learner

pytestmark = pytest.mark.usefixtures("one_thread")
SCALE = 10.0


def proto_learner(model, **options):
    defaults = {
        "loss": "cross_entropy",
        "shared_head": True,
        "prototype_head": True,
        "prototype_scale": SCALE,
        "inner_steps": 1,
        "inner_lr": 0.05,
    }
    return build_learner("maml", model, **{**defaults, **options})


def features(model, params, x):
    """The head's normalised input `[..., D]` for one task's `x`, computed apart."""
    captured = []
    handle = model.head.register_forward_pre_hook(lambda m, inputs: captured.append(inputs[0]))
    try:
        functional_call(model, params, (x,))
    finally:
        handle.remove()
    return F.normalize(captured[0], dim=-1)


def prototype_rows(model, params, x, y):
    """`(weight [N, D], bias [N])` of the nearest-centroid classifier, from the features."""
    f = features(model, params, x)
    means = torch.stack([f[y == c].mean(0) for c in range(NUM_WAYS)])
    weight = params["head.weight"] + 2 * SCALE * means
    bias = params["head.bias"] - SCALE * means.square().sum(-1)
    return weight, bias


@pytest.mark.parametrize("vectorize", [True, False])
def test_before_any_step_the_logits_are_minus_scaled_squared_distances(vectorize):
    model = classifier()
    learner = proto_learner(model, vectorize=vectorize)
    batch = episodes()
    with torch.no_grad():
        logits = learner.predict(learner.adapt(batch.support, steps=0), batch.query.x)
        params = dict(model.named_parameters())
        for task in range(logits.shape[0]):
            x, y = batch.support.x[task], batch.support.y[task]
            f = features(model, params, x)
            means = torch.stack([f[y == c].mean(0) for c in range(NUM_WAYS)])
            query = features(model, params, batch.query.x[task])
            expected = -SCALE * (query[:, None] - means[None]).square().sum(-1)
            shift = logits[task] - expected  # a constant per query example (|f|² = 1)
            torch.testing.assert_close(shift, shift[:, :1].expand_as(shift))


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("vectorize", [True, False])
def test_an_inner_step_adapts_the_rows_as_parameters_of_their_own(vectorize, grad):
    """One SGD step from the prototype rows equals the step computed apart with the rows
    as independent leaves: the gradient does not run back through the prototypes, also
    where they are differentiable functions of the body (grad mode, training)."""
    model = classifier().double()
    learner = proto_learner(model, vectorize=vectorize)
    batch = episodes(dtype=torch.float64)
    with torch.set_grad_enabled(grad):
        adapted = learner.adapt(batch.support, steps=1)
    shared = {n: p.detach() for n, p in model.named_parameters()}
    for task in range(batch.support.x.shape[0]):
        x, y = batch.support.x[task], batch.support.y[task]
        weight, bias = prototype_rows(model, shared, x, y)
        leaves = {n: p.clone().requires_grad_() for n, p in shared.items() if "head" not in n}
        leaves["head.weight"] = weight.clone().requires_grad_()
        leaves["head.bias"] = bias.clone().requires_grad_()
        loss = F.cross_entropy(functional_call(model, leaves, (x,)), y)
        grads = torch.autograd.grad(loss, list(leaves.values()))
        for (name, leaf), grad in zip(leaves.items(), grads, strict=True):
            torch.testing.assert_close(
                adapted[name][task].detach(), leaf.detach() - 0.05 * grad, rtol=1e-9, atol=1e-10
            )


@pytest.mark.parametrize("first_order", [True, False])
def test_meta_training_reaches_the_body_and_the_learned_rates(first_order):
    model = classifier()
    learner = proto_learner(
        model, inner_steps=3, first_order=first_order, learn_inner_lr=True,
        inner_lr_per_layer=True,
    )  # fmt: skip
    out = learner(episodes())
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert model.body[0].conv.weight.grad.abs().max() > 1e-5
    assert learner.inner_lrs.grad.abs().max() > 1e-6
    # before any step the shared head alone is at chance; the prototype rows are not
    assert out.metrics["query_accuracy_after"] > 1.5 / NUM_WAYS


def test_predictions_follow_the_way_labels():
    learner = proto_learner(classifier(), inner_steps=2)
    batch = episodes()
    with torch.no_grad():
        predicted = learner.predict(learner.adapt(batch.support), batch.query.x).argmax(-1)
        again = relabelled(batch, PERMUTATION)
        relabelled_predicted = learner.predict(learner.adapt(again.support), again.query.x)
    assert predicted.unique().numel() > 1
    assert torch.equal(relabelled_predicted.argmax(-1), PERMUTATION[predicted])


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match="learner 'maml': prototype_head needs shared_head"):
        proto_learner(classifier(), shared_head=False)
    with pytest.raises(ValueError, match="learner 'maml': prototype_scale must be a number > 0"):
        proto_learner(classifier(), prototype_scale=0)
    model = classifier()
    model.head = torch.nn.Linear(model.head.in_features, NUM_WAYS, bias=False)
    with pytest.raises(ValueError, match="prototype_head needs the model's head 'head' to have"):
        proto_learner(model)


@pytest.mark.parametrize("model_name", ["mlp", "tcn"])
def test_batched_tasks_are_the_per_task_loop_on_a_model_with_its_own_batched_path(model_name):
    """The mlp's own batched forward applied its head as a plain linear layer, without
    the normalised input: batched logits and meta-loss differed from the loop's."""
    batch = episodes(dtype=torch.float64)
    results = []
    for vectorize in (True, False):
        model = classifier(model_name).double()
        learner = proto_learner(model, vectorize=vectorize)
        params = learner.adapt(batch.support, steps=1)
        logits = learner.predict(params, batch.query.x)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.query.y.flatten())
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results.append((logits.detach(), grads))
    (batched, batched_grads), (loop, loop_grads) = results
    torch.testing.assert_close(batched, loop, rtol=1e-9, atol=1e-9)
    for a, b in zip(batched_grads, loop_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
