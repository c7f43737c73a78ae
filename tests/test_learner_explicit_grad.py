"""The written-out inner gradient (`MLP.batched_vjp`, `learners.explicit_grad`) against
the autograd path: adapted parameters and meta-gradients equal in float64."""

import pytest
import torch
from test_learners import make_batch

import metadist.learners.explicit_grad as explicit_grad
import metadist.learners.inner_loop as inner_loop
from metadist.batch import MetaBatch, TaskSet
from metadist.learners import build_learner
from metadist.learners.batching import has_batched_vjp
from metadist.models import build_model
from metadist.models.mlp import MLP
from metadist.train.distributed import DistEnv
from metadist.train.step import MetaStep

ACTIVATIONS = ("relu", "tanh", "silu", "gelu")
LEARNERS = [
    ("maml", {}),
    ("maml", {"inner_steps": 5}),
    ("maml", {"first_order": True}),
    ("maml", {"inner_steps": 3, "learn_inner_lr": True}),
    ("metasgd", {"inner_steps": 2}),
    ("anil", {"inner_steps": 2}),
]


pytestmark = pytest.mark.usefixtures("one_thread")


def _classification_batch(num_tasks=3, num_ways=3, shots=2, seed=0):
    g = torch.Generator().manual_seed(seed)

    def side(k):
        y = torch.arange(num_ways).repeat_interleave(k).repeat(num_tasks, 1)
        return TaskSet(torch.randn(num_tasks, num_ways * k, 4, generator=g, dtype=torch.float64), y)

    support, query = side(shots), side(shots + 1)
    return MetaBatch(support, query, torch.full((num_tasks,), -1),
                     torch.zeros(num_tasks, dtype=torch.int64), torch.full((num_tasks,), -1))  # fmt: skip


def _learner(name, loss, activation, options, explicit, monkeypatch):
    """The learner on a float64 MLP; `explicit=False` hides `batched_vjp` from the inner
    loop (the autograd path), decided at the learner's first call."""
    torch.manual_seed(0)
    shapes = ((4,), (3,)) if loss == "cross_entropy" else ((2,), (2,))
    model = build_model("mlp", *shapes, hidden_sizes=(6, 5), activation=activation).double()
    learner = build_learner(name, model, loss=loss, inner_lr=0.1, **options)
    monkeypatch.setattr(inner_loop, "has_batched_vjp", has_batched_vjp if explicit else _never)
    with torch.no_grad():  # decide the path now, under the patch
        learner.adapt(_batch(loss).support, steps=0)
    return learner


def _never(model):
    return False


def _batch(loss):
    if loss == "cross_entropy":
        return _classification_batch()
    return make_batch(num_tasks=3, x_shape=(2,), y_shape=(2,), dtype=torch.float64)


def _adapt_and_meta_gradient(learner, batch):
    learner.zero_grad()
    out = learner(batch)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in learner.named_parameters()}
    fast = learner.adapt(batch.support)
    with torch.no_grad():
        fast_eval = learner.adapt(batch.support)
    return out.loss.detach(), fast, fast_eval, grads


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("loss", ["mse", "mae", "cross_entropy"])
@pytest.mark.parametrize(("name", "options"), LEARNERS)
def test_written_out_inner_gradient_equals_autograd(name, options, loss, activation, monkeypatch):
    batch = _batch(loss)
    results = [
        _adapt_and_meta_gradient(
            _learner(name, loss, activation, options, explicit, monkeypatch), batch
        )
        for explicit in (True, False)
    ]
    (loss_a, fast_a, eval_a, grads_a), (loss_b, fast_b, eval_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=1e-10)
    for a, b in ((fast_a, fast_b), (eval_a, eval_b), (grads_a, grads_b)):
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-10, msg=key)
    assert all(g.abs().sum() > 0 for g in grads_a.values())


def test_shared_head_classification_equals_autograd(monkeypatch):
    batch = _classification_batch()
    results = []
    for explicit in (True, False):
        learner = _learner("maml", "cross_entropy", "relu", {"shared_head": True, "inner_steps": 2},
                           explicit, monkeypatch)  # fmt: skip
        results.append(_adapt_and_meta_gradient(learner, batch))
    for key, grad in results[0][3].items():
        torch.testing.assert_close(grad, results[1][3][key], rtol=0, atol=1e-10, msg=key)


def _count_autograd_grad(monkeypatch):
    calls = []
    real = torch.autograd.grad

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", counting)
    return calls


@pytest.mark.parametrize(("loss", "supported"), [("mse", True), ("smape", True), ("mape", False)])
def test_the_written_out_path_is_taken_for_supported_losses(loss, supported, monkeypatch):
    if not supported:  # a loss without a closed-form gradient takes the autograd path
        monkeypatch.delitem(explicit_grad.PREDICTION_GRADS, loss)
    torch.manual_seed(0)
    model = build_model("mlp", (2,), (2,), hidden_sizes=(6,)).double()
    learner = build_learner("maml", model, loss=loss, inner_steps=3)
    batch = make_batch(x_shape=(2,), y_shape=(2,), dtype=torch.float64)
    learner(batch).loss.backward()  # the first call checks parameter usage with autograd
    calls = _count_autograd_grad(monkeypatch)
    learner(batch).loss.backward()
    with torch.no_grad():
        learner.adapt(batch.support)
    # without a closed-form gradient: three autograd steps per call
    assert len(calls) == (0 if supported else 6)


def test_active_dropout_takes_the_autograd_path(monkeypatch):
    torch.manual_seed(0)
    model = build_model("mlp", (2,), (2,), hidden_sizes=(6,), dropout=0.5).double()
    learner = build_learner("maml", model, inner_steps=2)
    batch = make_batch(x_shape=(2,), y_shape=(2,), dtype=torch.float64)
    learner(batch)
    calls = _count_autograd_grad(monkeypatch)
    learner(batch).loss.backward()
    assert len(calls) == 2
    learner.eval()  # dropout inactive: the written-out gradient again
    learner(batch)
    assert len(calls) == 2


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_batched_vjp_with_shared_and_per_task_parameters(activation):
    torch.manual_seed(0)
    model = build_model("mlp", (3,), (2,), hidden_sizes=(4, 5), activation=activation).double()
    num_tasks = 3
    shared = dict(model.named_parameters())
    # per task: the first layer and the head; shared: the middle layer
    params = {
        n: p.detach().expand(num_tasks, *p.shape).clone().requires_grad_()
        if not n.startswith("body.2")
        else p
        for n, p in shared.items()
    }
    x = torch.randn(num_tasks, 7, 3, dtype=torch.float64)
    output, vjp = model.batched_vjp(params, x)
    full = {n: p if p.dim() > shared[n].dim() else p.expand(num_tasks, *p.shape)
            for n, p in params.items()}  # fmt: skip
    expected = model.batched_forward(full, x)
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-12)
    grad_output = torch.randn_like(output)
    wanted = ["body.2.weight", "head.weight", "head.bias"]  # no earlier layer: stops there
    grads = vjp(grad_output, wanted)
    assert sorted(grads) == sorted(wanted)
    reference = torch.autograd.grad((expected * grad_output).sum(), [full[n] for n in wanted])
    for name, ref in zip(wanted, reference, strict=True):
        assert grads[name].shape == (num_tasks, *shared[name].shape)
        torch.testing.assert_close(grads[name], ref, rtol=0, atol=1e-12, msg=name)


def test_models_without_a_written_out_backward():
    mlp = build_model("mlp", (2,), (1,), hidden_sizes=(3,))
    assert has_batched_vjp(mlp)

    class Doubled(MLP):
        def forward(self, x):
            return 2 * super().forward(x)

    assert not has_batched_vjp(Doubled((2,), (1,), hidden_sizes=(3,)))
    gelu_tanh = build_model("mlp", (2,), (1,), hidden_sizes=(3,), activation="gelu")
    gelu_tanh.body[1].approximate = "tanh"
    params = {n: p.expand(2, *p.shape) for n, p in gelu_tanh.named_parameters()}
    assert gelu_tanh.batched_vjp(params, torch.randn(2, 4, 2)) is None


@pytest.mark.slow
def test_torch_compile_of_a_second_order_learner_matches_eager():
    """No double backward is left in the meta-step, so Inductor can compile it (about a
    minute on a loaded CPU)."""
    batch = make_batch(num_tasks=3, x_shape=(2,), y_shape=(2,), dtype=torch.float64)
    grads = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = build_model("mlp", (2,), (2,), hidden_sizes=(6, 5)).double()
        learner = build_learner("maml", model, inner_steps=2, inner_lr=0.1)
        call = torch.compile(learner) if compiled else learner
        call(batch).loss.backward()
        grads.append({n: p.grad for n, p in learner.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=0, atol=1e-10, msg=name)


@pytest.mark.slow
def test_trainer_compile_keeps_second_order_maml_compiled():
    """`trainer.compile=true` used to fall back to eager for second-order MAML (no double
    backward in compiled graphs); on the written-out path it stays compiled (the C++
    wrapper on the CPU, `compile_options`), and in float64 its steps equal eager ones."""
    batch = make_batch(num_tasks=3, x_shape=(2,), y_shape=(2,), dtype=torch.float64)
    losses, params, messages = [], [], []
    for compile in (False, True):
        torch.manual_seed(0)
        model = build_model("mlp", (2,), (2,), hidden_sizes=(8,)).double()
        learner = build_learner("maml", model, inner_steps=2, inner_lr=0.1)
        optimizer = torch.optim.Adam(learner.parameters(), lr=1e-2)
        step = MetaStep(learner, learner, optimizer, DistEnv(), compile=compile,
                        message=messages.append)  # fmt: skip
        losses.append([step(batch, i, 1e-2, sync=True).loss for i in range(4)])
        assert step.compiled == compile
        params.append({n: p.detach().clone() for n, p in learner.named_parameters()})
    # it says it compiles and how long that took; nothing about running eagerly
    assert messages[0] == "trainer.compile: compiling the meta-step; the first steps take longer"
    assert len(messages) == 2 and messages[1].startswith("trainer.compile: compiled the")
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-10)
    for name, value in params[0].items():
        torch.testing.assert_close(params[1][name], value, rtol=0, atol=1e-10, msg=name)


def test_a_compiled_learner_runs_as_one_graph_after_its_first_call():
    """The one-time usage check of the first call (a graph break) is not kept in later
    calls: Dynamo traces the learner again once it is done. (A backend that counts the
    graphs run; without the finiteness check's host sync nothing else splits the step.)"""
    torch._dynamo.reset()
    graphs_run = [0]

    def counting_backend(graph, example_inputs):
        def run(*args):
            graphs_run[0] += 1
            return graph.forward(*args)

        return run

    batch = make_batch(num_tasks=3, x_shape=(2,), y_shape=(2,))
    model = build_model("mlp", (2,), (2,), hidden_sizes=(4,))
    learner = build_learner("maml", model, check_finite=False)
    compiled = torch.compile(learner, backend=counting_backend)
    for _ in range(3):
        compiled(batch).loss.backward()
    graphs_run[0] = 0
    compiled(batch).loss.backward()
    assert graphs_run[0] == 1
