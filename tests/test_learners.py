"""Learners: meta-gradients against finite differences, vmap against the per-task loop,
the special cases of each algorithm, and the errors of the inner loop."""

import logging

import numpy as np
import pytest
import torch
from torch import nn

from metadist.batch import MetaBatch, TaskSet
from metadist.learners import (
    MetaOutput,
    build_learner,
    get_learner,
    registered_learners,
    task_loss,
    task_losses,
)
from metadist.models import build_model, registered_models
from metadist.tasks import build_task_sampler, derive_task_seeds

pytestmark = pytest.mark.usefixtures("one_thread")


def make_batch(
    num_tasks=3, x_shape=(1,), y_shape=(1,), num_support=4, num_query=5, seed=0, dtype=torch.float32
):
    g = torch.Generator().manual_seed(seed)

    def side(k):
        return TaskSet(
            torch.randn(num_tasks, k, *x_shape, generator=g, dtype=dtype),
            torch.randn(num_tasks, k, *y_shape, generator=g, dtype=dtype),
        )

    return _meta_batch(side(num_support), side(num_query))


def classification_batch(num_tasks=3, num_ways=3, num_shots=2, num_query=2, seed=0):
    g = torch.Generator().manual_seed(seed)

    def side(k):
        y = torch.arange(num_ways).repeat_interleave(k).repeat(num_tasks, 1)
        x = torch.randn(num_tasks, num_ways * k, 6, 2, generator=g) + y[..., None, None] * 0.5
        return TaskSet(x, y)

    return _meta_batch(side(num_shots), side(num_query))


def _meta_batch(support, query):
    num_tasks = support.x.shape[0]
    return MetaBatch(
        support=support,
        query=query,
        entity_index=torch.full((num_tasks,), -1),
        stratum=torch.zeros(num_tasks, dtype=torch.int64),
        split_time=torch.full((num_tasks,), -1),
    )


def sinusoid_batch(num_tasks, num_support=10, num_query=10, seed=0, epoch=0, grid=False):
    sampler = build_task_sampler(
        "sinusoid", num_support=num_support, num_query=num_query, query_grid=grid
    )
    positions = np.arange(num_tasks)
    return sampler.sample(positions, derive_task_seeds(seed, epoch, positions))


def tiny_learner(name="maml", dtype=torch.float64, **options):
    torch.manual_seed(0)
    model = build_model("mlp", (1,), (1,), hidden_sizes=(5,), activation="tanh").to(dtype)
    return build_learner(name, model, **options)


def meta_gradient(learner, batch):
    learner.zero_grad()
    learner(batch).loss.backward()
    return {n: p.grad.clone() for n, p in learner.named_parameters()}


def finite_difference(learner, batch, eps=1e-6):
    """Central differences of the meta-loss w.r.t. every learner parameter entry."""
    grads = {}
    with torch.no_grad():
        for name, p in learner.named_parameters():
            g = torch.zeros_like(p)
            for i in range(p.numel()):
                original = p.view(-1)[i].item()
                p.view(-1)[i] = original + eps
                plus = learner(batch).loss.item()
                p.view(-1)[i] = original - eps
                minus = learner(batch).loss.item()
                p.view(-1)[i] = original
                g.view(-1)[i] = (plus - minus) / (2 * eps)
            grads[name] = g
    return grads


# ---------------------------------------------------------------- meta-gradients
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("maml", {"inner_steps": 2, "inner_lr": 0.3}),
        ("maml", {"inner_steps": 2, "inner_lr": 0.3, "learn_inner_lr": True}),
        ("metasgd", {"inner_steps": 2, "inner_lr": 0.3}),
        ("anil", {"inner_steps": 2, "inner_lr": 0.3}),
    ],
)
def test_second_order_meta_gradient_matches_finite_differences(name, options):
    learner = tiny_learner(name, **options)
    batch = make_batch(dtype=torch.float64)
    analytic = meta_gradient(learner, batch)
    numeric = finite_difference(learner, batch)
    for key in analytic:
        torch.testing.assert_close(analytic[key], numeric[key], rtol=1e-5, atol=1e-7)


def test_first_order_drops_exactly_the_second_order_terms():
    batch = make_batch(dtype=torch.float64)
    second = tiny_learner("maml", inner_steps=1, inner_lr=0.3)
    first = tiny_learner("maml", inner_steps=1, inner_lr=0.3, first_order=True)
    g2, g1 = meta_gradient(second, batch), meta_gradient(first, batch)
    difference = torch.cat([(g2[k] - g1[k]).flatten() for k in g2]).norm()
    assert difference > 1e-3 * torch.cat([g.flatten() for g in g2.values()]).norm()

    # FOMAML's gradient is the mean over tasks of the query-loss gradient at the adapted
    # weights, computed here with plain autograd one task at a time.
    model = first.model
    expected = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for b in range(batch.num_tasks):
        weights = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
        support = torch.func.functional_call(model, weights, (batch.support.x[b],))
        grads = torch.autograd.grad(
            ((support - batch.support.y[b]) ** 2).mean(), list(weights.values())
        )
        adapted = {
            n: (w - 0.3 * g).detach().requires_grad_()
            for (n, w), g in zip(weights.items(), grads, strict=True)
        }
        query = torch.func.functional_call(model, adapted, (batch.query.x[b],))
        query_grads = torch.autograd.grad(
            ((query - batch.query.y[b]) ** 2).mean(), list(adapted.values())
        )
        for n, g in zip(adapted, query_grads, strict=True):
            expected[n] += g / batch.num_tasks
    for n in expected:
        torch.testing.assert_close(g1["model." + n], expected[n])


def test_zero_inner_steps_is_plain_training_on_the_query_loss():
    batch = make_batch(num_tasks=4)
    learner = tiny_learner("maml", dtype=torch.float32, inner_steps=0)
    out = learner(batch)
    grads = meta_gradient(learner, batch)

    plain = tiny_learner("maml", dtype=torch.float32).model
    loss = ((plain(batch.query.x) - batch.query.y) ** 2).mean()
    loss.backward()
    torch.testing.assert_close(out.loss, loss)
    for n, p in plain.named_parameters():
        torch.testing.assert_close(grads["model." + n], p.grad)
    assert out.metrics["query_loss_before"] == pytest.approx(out.metrics["query_loss_after"].item())


def test_metasgd_step_sizes_get_nonzero_gradients():
    learner = tiny_learner("metasgd", dtype=torch.float32, inner_lr=0.05)
    grads = meta_gradient(learner, make_batch())
    lr_grads = {k: g for k, g in grads.items() if k.startswith("inner_lrs.")}
    assert set(lr_grads) == {
        "inner_lrs." + n.replace(".", "__") for n, _ in learner.model.named_parameters()
    }
    for key, g in lr_grads.items():
        assert g.abs().sum() > 0, key


def test_learned_per_step_inner_lr():
    learner = tiny_learner("maml", dtype=torch.float32, inner_steps=3, learn_inner_lr=True)
    assert learner.inner_lrs.shape == (3,)
    grads = meta_gradient(learner, make_batch())
    assert (grads["inner_lrs"] != 0).all()
    # Evaluation beyond the trained number of steps reuses the last step size.
    with torch.no_grad():
        learner.inner_lrs.copy_(torch.tensor([0.1, 0.2, 0.0]))
        params3 = learner.adapt(make_batch().support, steps=3)
        params5 = learner.adapt(make_batch().support, steps=5)
    for n in params3:
        torch.testing.assert_close(params3[n], params5[n])


def test_anil_adapts_only_the_head():
    learner = tiny_learner("anil", dtype=torch.float32, inner_steps=3, inner_lr=0.1)
    batch = make_batch()
    params = learner.adapt(batch.support)
    for name, p in learner.model.named_parameters():
        same = torch.equal(params[name], p.detach().expand_as(params[name]))
        assert same == (not name.startswith("head.")), name
    grads = meta_gradient(learner, batch)  # the body still learns in the outer loop
    assert all(g.abs().sum() > 0 for g in grads.values())


def test_anil_named_head_and_bad_head():
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    learner = build_learner("anil", model)
    assert learner.adapted_names() == ["2.weight", "2.bias"]
    assert build_learner("anil", model, head="0").adapted_names() == ["0.weight", "0.bias"]
    with pytest.raises(ValueError, match="head 'neck' is not a sub-module"):
        build_learner("anil", model, head="neck")
    with pytest.raises(ValueError, match="head '1' has no trainable parameters"):
        build_learner("anil", model, head="1")


def test_reptile_gradient_is_the_distance_to_the_adapted_weights():
    learner = tiny_learner("reptile", inner_steps=3, inner_lr=0.1)
    batch = make_batch(num_tasks=4, dtype=torch.float64)
    grads = meta_gradient(learner, batch)

    model = learner.model
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    mean_adapted = {n: torch.zeros_like(p) for n, p in theta.items()}
    for b in range(batch.num_tasks):
        fast = {n: p.clone() for n, p in theta.items()}
        for _ in range(3):  # plain SGD on the support set
            fast = {n: p.requires_grad_() for n, p in fast.items()}
            out = torch.func.functional_call(model, fast, (batch.support.x[b],))
            g = torch.autograd.grad(((out - batch.support.y[b]) ** 2).mean(), list(fast.values()))
            fast = {n: (p - 0.1 * gi).detach() for (n, p), gi in zip(fast.items(), g, strict=True)}
        for n in fast:
            mean_adapted[n] += fast[n] / batch.num_tasks
    for n in theta:
        torch.testing.assert_close(grads["model." + n], theta[n] - mean_adapted[n])

    # SGD with lr epsilon on the surrogate is Reptile's interpolation step.
    epsilon = 0.25
    torch.optim.SGD(learner.parameters(), lr=epsilon).step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), theta[n] + epsilon * (mean_adapted[n] - theta[n]))


def test_protonet_prototypes_and_logits():
    torch.manual_seed(0)
    model = build_model("mlp", (6, 2), (4,), hidden_sizes=(8,))
    learner = build_learner("protonet", model)
    batch = classification_batch()
    params = learner.adapt(batch.support)
    embeddings = model(batch.support.x)
    for b in range(batch.num_tasks):
        for c in range(3):
            expected = embeddings[b][batch.support.y[b] == c].mean(0)
            torch.testing.assert_close(params["prototypes"][b, c], expected)
    logits = learner.predict(params, batch.query.x)
    expected = -(torch.cdist(model(batch.query.x), params["prototypes"]) ** 2)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    out = learner(batch)
    assert set(out.metrics) == {"query_loss_after", "query_accuracy_after"}
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_protonet_errors():
    model = build_model("mlp", (6, 2), (4,))
    batch = classification_batch()
    with pytest.raises(ValueError, match="class 3 has no support example in task 0"):
        build_learner("protonet", model, num_ways=4).adapt(batch.support)
    with pytest.raises(ValueError, match="loss must be 'cross_entropy'"):
        build_learner("protonet", model, loss="mse")
    with pytest.raises(ValueError, match="support labels must lie in"):
        bad = TaskSet(batch.support.x, batch.support.y - 1)
        build_learner("protonet", model).adapt(bad)


# -------------------------------------------------------- vmap against the loop
def _model_and_batch(learner_name, model_name):
    torch.manual_seed(0)
    if not get_learner(learner_name).has_inner_loop:  # an embedding network, classifying
        return build_model(model_name, (6, 2), (4,), **_small(model_name)), classification_batch()
    model = build_model(model_name, (6, 2), (2, 1), **_small(model_name))
    return model, make_batch(num_tasks=3, x_shape=(6, 2), y_shape=(2, 1))


def _small(model_name):
    return {
        "mlp": {"hidden_sizes": (8,)},
        "forecaster": {"hidden_sizes": (8,)},
        "tcn": {"channels": 4, "num_levels": 2},
        "transformer": {"d_model": 8, "num_heads": 2, "num_layers": 1, "ff_size": 8},
        "gru": {"hidden_size": 4},
        "nbeats": {"blocks_per_stack": 2, "width": 8},
    }[model_name]


def _run(learner):
    batch = learner._test_batch
    out = learner(batch)
    learner.zero_grad()
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in learner.named_parameters()}
    with torch.no_grad():
        params = learner.adapt(batch.support, steps=2)
        prediction = learner.predict(params, batch.query.x)
    return out, grads, prediction


def _gradient_rounding(learner_name: str) -> float:
    """How many times the plain learners' rounding a learner's gradients carry. The
    Meta-Baseline learners' logits are a learned scale (about 10) times a cosine, so their
    gradients carry ten times the rounding (2.4e-6 seen on the TCN's convolutions); an
    Adam inner step (metabaseline_adam/_tune) divides by the gradient's own size, so a
    rounding difference in a near-zero gradient moves a weight by up to a whole step
    (lr 0.01) too."""
    return 10.0 if learner_name.startswith("metabaseline") else 1.0


@pytest.mark.parametrize("model_name", registered_models())
@pytest.mark.parametrize("learner_name", registered_learners())
def test_vmap_equals_the_per_task_loop(learner_name, model_name, caplog):
    model, batch = _model_and_batch(learner_name, model_name)
    inner_loop = get_learner(learner_name).has_inner_loop
    options = {"inner_steps": 2} if inner_loop and learner_name != "reptile" else {}
    results = []
    for vectorize in (True, False):
        learner = build_learner(learner_name, model, vectorize=vectorize, **options)
        learner._test_batch = batch
        with caplog.at_level(logging.WARNING, logger="metadist.learners"):
            results.append(_run(learner))
        if vectorize and inner_loop:
            # The GRU has no vmap batching rule: the learner must fall back and say so.
            assert learner._vmap_failed == (model_name == "gru")
    (out_v, grads_v, pred_v), (out_l, grads_l, pred_l) = results
    torch.testing.assert_close(out_v.loss, out_l.loss, rtol=1e-6, atol=1e-6)
    for key in out_l.metrics:
        torch.testing.assert_close(out_v.metrics[key], out_l.metrics[key], rtol=1e-6, atol=1e-6)
    factor = _gradient_rounding(learner_name)
    for key in grads_l:
        torch.testing.assert_close(
            grads_v[key], grads_l[key], rtol=1e-6 * factor, atol=1e-6 * factor
        )
    # float32 rounding near 0 scales with the largest output (metabaseline's logits are
    # 10 x a cosine)
    scale = max(1.0, pred_l.abs().max().item())
    torch.testing.assert_close(pred_v, pred_l, rtol=1e-6 * factor, atol=1e-6 * factor * scale)


def test_fallback_to_the_loop_is_announced_once(caplog):
    """Batch norm updating running statistics cannot be vmapped: loop, one notice."""
    from metadist.learners import dispatch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    dispatch._WARNED_FALLBACK.clear()
    learner = build_learner("maml", model, first_order=True)
    batch = make_batch()
    with caplog.at_level(logging.WARNING, logger="metadist.learners"):
        for _ in range(3):
            learner(batch)
    notices = [r for r in caplog.records if "per-task loop" in r.getMessage()]
    assert len(notices) == 1
    assert "Sequential" in notices[0].getMessage()
    assert learner._vmap_failed


@pytest.mark.parametrize("inner_steps", [1, 2])
@pytest.mark.parametrize(
    "norm",
    [nn.LayerNorm(6), nn.BatchNorm1d(6, track_running_stats=False), nn.GroupNorm(2, 6)],
    ids=["layer_norm", "batch_norm", "group_norm"],
)
def test_fused_norms_second_order_stays_batched_and_exact(norm, inner_steps, caplog):
    """A vmapped double backward through fused norm kernels is wrong
    (pytorch/functorch#534); the batched inner loop nests no transform around a gradient,
    so these models stay batched, with no fallback notice, and match finite differences."""
    from metadist.learners import dispatch

    dispatch._WARNED_FALLBACK.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 6), norm, nn.Tanh(), nn.Linear(6, 1)).double()
    learner = build_learner("maml", model, inner_steps=inner_steps, inner_lr=0.5)
    batch = make_batch(dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="metadist.learners"):
        analytic = meta_gradient(learner, batch)
    assert not any("per-task loop" in r.getMessage() for r in caplog.records)
    assert not learner._vmap_failed
    numeric = finite_difference(learner, batch)
    for key in analytic:
        torch.testing.assert_close(analytic[key], numeric[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("model_name", ["mlp", "forecaster"])
def test_batched_forward_equals_functional_call_per_task(model_name):
    """The MLP's native batched path (batched matmuls over [B, ...] parameters) is the
    model under each task's own parameters."""
    from metadist.learners.base import has_batched_forward

    torch.manual_seed(0)
    x_shape = (1,) if model_name == "mlp" else (6, 2)
    model = build_model(model_name, x_shape, (3,), hidden_sizes=(8, 5)).double()
    assert has_batched_forward(model)
    params = {
        n: p.detach() + 0.1 * torch.randn(4, *p.shape, dtype=p.dtype)
        for n, p in model.named_parameters()
    }
    x = torch.randn(4, 7, *x_shape, dtype=torch.float64)
    batched = model.batched_forward(params, x)
    for b in range(4):
        expected = torch.func.functional_call(model, {n: p[b] for n, p in params.items()}, x[b])
        torch.testing.assert_close(batched[b], expected)


def test_a_subclass_overriding_forward_does_not_inherit_batched_forward():
    from metadist.learners.base import has_batched_forward
    from metadist.models.mlp import MLP

    class Doubled(MLP):
        def forward(self, x):
            return 2 * super().forward(x)

    torch.manual_seed(0)
    model = Doubled((1,), (1,), hidden_sizes=(8,))
    assert not has_batched_forward(model)
    batch = make_batch()
    learners = [build_learner("maml", model, vectorize=v) for v in (True, False)]
    batched, looped = (learner(batch).loss for learner in learners)
    torch.testing.assert_close(batched, looped, rtol=1e-6, atol=1e-6)


def test_tied_weights_are_adapted_as_one_parameter():
    """Two names sharing one tensor adapt together (functional_call's weight tying stays
    on for such models) and the meta-gradient is exact."""

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(3, 3)
            self.second = nn.Linear(3, 3)
            self.second.weight = self.first.weight
            self.inp = nn.Linear(1, 3)
            self.head = nn.Linear(3, 1)

        def forward(self, x):
            return self.head(torch.tanh(self.second(torch.tanh(self.first(self.inp(x))))))

    torch.manual_seed(0)
    model = Tied().double()
    batch = make_batch(dtype=torch.float64)
    for vectorize in (True, False):
        learner = build_learner("maml", model, inner_steps=1, inner_lr=0.3, vectorize=vectorize)
        assert learner._tie_weights
        analytic = meta_gradient(learner, batch)
        numeric = finite_difference(learner, batch)
        for key in analytic:
            torch.testing.assert_close(analytic[key], numeric[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["maml", "metasgd", "anil", "reptile"])
def test_learner_moves_and_copies_like_any_module(name):
    """`.to()` / `.double()` and deepcopy (what training does) work and keep the result."""
    import copy

    learner = tiny_learner(name, dtype=torch.float32)
    batch = make_batch(dtype=torch.float64)
    moved = learner.double()
    assert all(p.dtype == torch.float64 for p in moved.parameters())
    copied = copy.deepcopy(moved)
    torch.testing.assert_close(copied(batch).loss, moved(batch).loss)


def test_a_real_bug_is_raised_by_the_loop_not_hidden():
    model = build_model("mlp", (1,), (2,))  # output (2,) cannot match targets (1,)
    learner = build_learner("maml", model)
    with pytest.raises(ValueError, match=r"model output \(4, 2\) does not match targets") as info:
        learner(make_batch())
    assert info.value.__context__ is None  # no chained vmap traceback before it
    assert not learner._vmap_failed


# ---------------------------------------------------------------- evaluation API
def test_eval_mode_uses_eval_inner_steps():
    learner = tiny_learner("maml", dtype=torch.float32, inner_steps=1, eval_inner_steps=4)
    support = make_batch().support
    learner.eval()
    with torch.no_grad():
        default = learner.adapt(support)
        explicit = learner.adapt(support, steps=4)
        one = learner.adapt(support, steps=1)
    assert all(torch.equal(default[n], explicit[n]) for n in default)
    assert not torch.equal(default["head.weight"], one["head.weight"])
    assert default["head.weight"].shape == (3, 1, 5)
    assert learner.predict(default, make_batch().query.x).shape == (3, 5, 1)


@pytest.mark.parametrize("name", ["maml", "metasgd", "anil", "reptile"])
def test_unadapted_metrics_can_be_skipped(name):
    batch = make_batch()
    full = tiny_learner(name, dtype=torch.float32)(batch)
    lean = tiny_learner(name, dtype=torch.float32, unadapted_metrics=False)(batch)
    assert "query_loss_before" in full.metrics
    assert set(lean.metrics) == set(full.metrics) - {"query_loss_before"}
    torch.testing.assert_close(lean.loss, full.loss)


def test_cross_entropy_learner_reports_accuracy():
    torch.manual_seed(0)
    model = build_model("mlp", (6, 2), (3,), hidden_sizes=(8,))
    learner = build_learner("maml", model, loss="cross_entropy", inner_lr=0.1)
    out = learner(classification_batch())
    assert isinstance(out, MetaOutput)
    assert {"query_accuracy_before", "query_accuracy_after"} <= set(out.metrics)
    assert 0.0 <= out.metrics["query_accuracy_after"].item() <= 1.0


# ------------------------------------------------------------------------ errors
def test_parameter_without_gradient_is_named():
    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(1, 1)
            self.spare = nn.Linear(1, 1)

        def forward(self, x):
            return self.head(x)

    with pytest.raises(RuntimeError, match=r"parameter\(s\) spare.weight, spare.bias get no"):
        build_learner("maml", Unused())(make_batch())
    model = Unused()
    model.spare.requires_grad_(False)  # frozen parameters are left alone
    build_learner("maml", model)(make_batch())


def test_nan_loss_names_the_inner_step():
    learner = tiny_learner("maml", dtype=torch.float32, inner_steps=3, inner_lr=1e30)
    with pytest.raises(RuntimeError, match=r"support loss is (nan|inf) at inner step [12]"):
        learner(make_batch())
    batch = make_batch()
    batch.support.x[1, 2] = float("nan")
    with pytest.raises(RuntimeError, match=r"at inner step 0 .* of task 1 in the batch"):
        tiny_learner("maml", dtype=torch.float32)(batch)


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [
        ("maml", {"inner_steps": -1}, "inner_steps"),
        ("maml", {"inner_steps": 1.5}, "inner_steps"),
        ("maml", {"inner_lr": 0}, "inner_lr"),
        ("maml", {"eval_inner_steps": -2}, "eval_inner_steps"),
        ("maml", {"first_order": "yes"}, "first_order"),
        ("maml", {"loss": "l1"}, "loss"),
        ("maml", {"vectorize": 1}, "vectorize"),
        ("maml", {"inner_steps": 0, "learn_inner_lr": True}, "inner_steps"),
        ("metasgd", {"inner_lr": -0.1}, "inner_lr"),
        ("reptile", {"inner_steps": 0}, "inner_steps"),
        ("protonet", {"num_ways": 1}, "num_ways"),
        ("maml", {"momentum": 0.9}, "momentum"),
    ],
)
def test_bad_options_name_the_field(name, options, field):
    model = build_model("mlp", (1,), (1,))
    with pytest.raises(ValueError, match=field):
        build_learner(name, model, **options)


def test_registry():
    assert set(registered_learners()) >= {"maml", "metasgd", "anil", "reptile", "protonet"}
    with pytest.raises(ValueError, match="unknown learner 'mamba'; registered: anil"):
        get_learner("mamba")
    with pytest.raises(ValueError, match="adapt.*negative|steps must be an int >= 0"):
        tiny_learner("maml").adapt(make_batch(dtype=torch.float64).support, steps=-1)


# -------------------------------------------------------------------- behaviour
def test_short_sinusoid_meta_training_beats_the_unadapted_model():
    """300 seeded meta-steps of Meta-SGD (Finn et al.'s workload) cut the post-adaptation
    MSE on fresh tasks well below the unadapted model's."""
    torch.manual_seed(0)
    model = build_model("mlp", (1,), (1,))
    learner = build_learner("metasgd", model, inner_steps=1, inner_lr=0.01)
    optimizer = torch.optim.Adam(learner.parameters(), lr=1e-3)
    sampler = build_task_sampler("sinusoid", num_support=10, num_query=10)
    for step in range(300):
        positions = np.arange(step * 25, (step + 1) * 25)
        batch = sampler.sample(positions, derive_task_seeds(0, 0, positions))
        optimizer.zero_grad()
        learner(batch).loss.backward()
        optimizer.step()
    test = sinusoid_batch(500, num_query=100, seed=1, grid=True)
    learner.eval()
    with torch.no_grad():
        before = ((model(test.query.x) - test.query.y) ** 2).mean()
        params = learner.adapt(test.support, steps=1)
        after = ((learner.predict(params, test.query.x) - test.query.y) ** 2).mean()
    assert after < 0.5 * before, (after, before)


@pytest.mark.parametrize("learner_name", ["maml", "metasgd", "anil"])
@pytest.mark.parametrize("model_name", ["forecaster", "tcn", "nbeats"])
def test_window_normalised_models_batch_like_the_loop(learner_name, model_name):
    """Window normalisation inside the model works on the batched paths (the forecaster's
    native `batched_forward`, the TCN's vmap) exactly as in the per-task loop, and changes
    the result (it is not silently skipped on either path)."""
    torch.manual_seed(0)
    batch = make_batch(num_tasks=3, x_shape=(6, 2), y_shape=(2, 1))
    options = {"window_norm": "last", "target_channels": [1], **_small(model_name)}
    results = {}
    for norm in ("last", "none"):
        torch.manual_seed(0)
        model = build_model(model_name, (6, 2), (2, 1), **{**options, "window_norm": norm})
        for vectorize in (True, False):
            learner = build_learner(learner_name, model, vectorize=vectorize, inner_steps=2)
            learner._test_batch = batch
            results[norm, vectorize] = _run(learner)
            assert not learner._vmap_failed
    (out_v, grads_v, pred_v), (out_l, grads_l, pred_l) = (
        results["last", True],
        results["last", False],
    )
    torch.testing.assert_close(out_v.loss, out_l.loss, rtol=1e-6, atol=1e-6)
    factor = _gradient_rounding(learner_name)
    for key in grads_l:
        torch.testing.assert_close(
            grads_v[key], grads_l[key], rtol=1e-6 * factor, atol=1e-6 * factor
        )
    torch.testing.assert_close(pred_v, pred_l, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(pred_v, results["none", True][2], atol=1e-4)


def test_regression_losses_against_hand_computed_values():
    prediction = torch.tensor([[[1.0], [3.0]], [[0.0], [2.0]]])  # [B=2, 2, 1]
    target = torch.tensor([[[2.0], [3.0]], [[0.0], [4.0]]])
    # task 0: errors 1, 0; task 1: errors 0, 2 (with 0 vs 0, which sMAPE scores 0)
    torch.testing.assert_close(task_losses("mse", prediction, target), torch.tensor([0.5, 2.0]))
    torch.testing.assert_close(task_losses("mae", prediction, target), torch.tensor([0.5, 1.0]))
    smape = task_losses("smape", prediction, target)
    torch.testing.assert_close(smape, torch.tensor([(2 / 3) / 2, (4 / 6) / 2]))
    torch.testing.assert_close(task_loss("smape", prediction[1], target[1]), smape[1])
    torch.testing.assert_close(task_loss("mae", prediction[0], target[0]), torch.tensor(0.5))
    # sMAPE is scale-free; its gradient stays finite where prediction and target are 0.
    torch.testing.assert_close(task_losses("smape", 1000 * prediction, 1000 * target), smape)
    leaf = prediction.clone().requires_grad_(True)
    task_losses("smape", leaf, target).sum().backward()
    assert torch.isfinite(leaf.grad).all()
    with pytest.raises(ValueError, match="smape loss: model output"):
        task_losses("smape", prediction, target[:, :1])
    # MAPE: |y - p| / |y|; task 0: 1/2 and 0; task 1: 0 (y = 0 counts 0) and 2/4.
    mape = task_losses("mape", prediction, target)
    torch.testing.assert_close(mape, torch.tensor([0.25, 0.25]))
    torch.testing.assert_close(task_losses("mape", 7 * prediction, 7 * target), mape)
    leaf = prediction.clone().requires_grad_(True)
    task_losses("mape", leaf, target).sum().backward()
    assert torch.isfinite(leaf.grad).all()


@pytest.mark.parametrize("loss", ["mae", "smape", "mape"])
def test_maml_adapts_under_scale_free_losses(loss):
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=[1], output_shape=[1], hidden_sizes=[16])
    learner = build_learner("maml", model, loss=loss, inner_steps=3, inner_lr=0.1)
    x = torch.linspace(-1, 1, 20).reshape(1, 20, 1)
    support = TaskSet(x, 5 + 2 * x)  # positive targets, as sMAPE expects
    before = task_loss(loss, learner.predict(learner.adapt(support, steps=0), x)[0], support.y[0])
    after = task_loss(loss, learner.predict(learner.adapt(support), x)[0], support.y[0])
    assert after < before


def test_ensemble_reduces_the_members_adapted_predictions():
    from metadist.learners.ensemble import LearnerEnsemble

    torch.manual_seed(0)
    members = [
        build_learner(
            name,
            build_model("mlp", input_shape=[1], output_shape=[1], hidden_sizes=[8]),
            inner_steps=2,
            inner_lr=0.1,
        )
        for name in ("maml", "metasgd", "maml")
    ]
    x = torch.linspace(-1, 1, 12).reshape(2, 6, 1)
    support, query_x = TaskSet(x, torch.sin(3 * x)), x + 0.1
    own = [m.predict(m.adapt(support), query_x) for m in members]
    ensemble = LearnerEnsemble(members[:2])
    params = ensemble.adapt(support)
    assert {k.split("/")[0] for k in params} == {"0", "1"}
    torch.testing.assert_close(ensemble.predict(params, query_x), (own[0] + own[1]) / 2)
    median = LearnerEnsemble(members, reduce="median")
    torch.testing.assert_close(
        median.predict(median.adapt(support), query_x), torch.stack(own).median(0).values
    )
    unadapted = ensemble.predict(ensemble.adapt(support, steps=0), query_x)
    torch.testing.assert_close(
        unadapted,
        sum(m.predict(m.adapt(support, steps=0), query_x) for m in members[:2]) / 2,
    )
    with pytest.raises(ValueError, match="at least two"):
        LearnerEnsemble(members[:1])
    with pytest.raises(ValueError, match="reduce must be one of"):
        LearnerEnsemble(members, reduce="max")
    classifier = build_learner(
        "maml", build_model("mlp", input_shape=[1], output_shape=[3]), loss="cross_entropy"
    )
    with pytest.raises(ValueError, match="share one loss"):
        LearnerEnsemble([members[0], classifier])


def test_ensemble_members_with_shorter_lookbacks_see_the_latest_rows():
    from metadist.learners.ensemble import LearnerEnsemble

    torch.manual_seed(0)
    long, short = (
        build_learner(
            "maml",
            build_model("forecaster", input_shape=[rows, 1], output_shape=[2, 1]),
            inner_steps=1,
            inner_lr=0.1,
        )
        for rows in (6, 4)
    )
    x = torch.randn(3, 5, 6, 1)  # [B, K, L, F]
    support = TaskSet(x, torch.randn(3, 5, 2, 1))
    query_x = torch.randn(3, 1, 6, 1)
    ensemble = LearnerEnsemble([long, short], lookbacks=[None, 4])
    expected = (
        long.predict(long.adapt(support), query_x)
        + short.predict(short.adapt(TaskSet(x[..., 2:, :], support.y)), query_x[..., 2:, :])
    ) / 2
    torch.testing.assert_close(ensemble.predict(ensemble.adapt(support), query_x), expected)
    with pytest.raises(ValueError, match="looks back 8 rows; the windows hold 6"):
        LearnerEnsemble([long, short], lookbacks=[None, 8]).adapt(support)
    with pytest.raises(ValueError, match="one positive integer or None per member"):
        LearnerEnsemble([long, short], lookbacks=[4])
