"""The meta-step's guard (no host sync per step), compile fallback and bf16 autocast."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sinusoid_batches import sinusoid_batches

from metadist.batch import MetaBatch, TaskSet
from metadist.learners import build_learner
from metadist.models import build_model
from metadist.train import NonFiniteLossError, latest_checkpoint_state, load_config, train
from metadist.train.distributed import DistEnv
from metadist.train.step import MetaStep, compile_options, resolved_check_every

TINY = [
    "experiment=sinusoid_maml",
    "sampler.options.num_tasks=40",
    "model.options.hidden_sizes=[8]",
    "trainer.meta_batch_size=4",
    "logging.progress=false",
    "logging.wandb.mode=disabled",
]


pytestmark = pytest.mark.usefixtures("one_thread")


def batches(num, num_tasks=5):
    return sinusoid_batches(num, num_tasks)


def poisoned(batch: MetaBatch) -> MetaBatch:
    y = batch.query.y.clone()
    y[1, 2] = float("nan")
    return MetaBatch(
        support=batch.support,
        query=TaskSet(batch.query.x, y),
        entity_index=batch.entity_index,
        stratum=batch.stratum,
        split_time=batch.split_time,
    )


def parts(check_every, optimizer="adam", **options):
    torch.manual_seed(0)
    model = build_model("mlp", (1,), (1,), hidden_sizes=(8,))
    learner = build_learner("maml", model, inner_steps=1, inner_lr=0.01)
    if optimizer == "adam":
        opt = torch.optim.Adam(learner.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(learner.parameters(), lr=1e-2, momentum=0.9)
    return (
        learner,
        opt,
        MetaStep(learner, learner, opt, DistEnv(), check_every=check_every, **options),
    )


def snapshot(learner, optimizer):
    params = {n: p.detach().clone() for n, p in learner.named_parameters()}
    state = {
        (i, k): v.clone()
        for i, p in enumerate(learner.parameters())
        for k, v in optimizer.state.get(p, {}).items()
    }
    return params, state


def assert_same(a, b):
    assert a[0].keys() == b[0].keys() and a[1].keys() == b[1].keys()
    for part in (0, 1):
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), key


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_non_finite_step_is_never_applied_between_reads(optimizer):
    data = batches(4)
    learner, opt, meta_step = parts(4, optimizer)
    assert meta_step(data[0], 0, 1e-2, sync=False) is None
    before = snapshot(learner, opt)
    # Step 2 is poisoned; steps 2 and 3 are not read, so they run with the mask.
    assert meta_step(poisoned(data[1]), 1, 1e-2, sync=False) is None
    assert_same(snapshot(learner, opt), before)
    assert meta_step(data[2], 2, 1e-2, sync=False) is None  # finite, but after a bad one
    assert_same(snapshot(learner, opt), before)
    reading = meta_step(data[3], 3, 1e-2, sync=True)
    assert reading is not None and reading.bad_step == 2 and not reading.stop
    assert_same(snapshot(learner, opt), before)
    assert all(torch.isfinite(p).all() for p in learner.parameters())


def test_a_poisoned_first_step_leaves_fresh_parameters_and_zero_state():
    data = batches(2)
    learner, opt, meta_step = parts(8)
    initial = {n: p.detach().clone() for n, p in learner.named_parameters()}
    meta_step(poisoned(data[0]), 0, 1e-2, sync=False)
    for name, p in learner.named_parameters():
        assert torch.equal(p, initial[name])
        assert all(torch.count_nonzero(v) == 0 for v in opt.state[p].values())
    assert meta_step(data[1], 1, 1e-2, sync=True).bad_step == 1


def test_masked_steps_equal_plain_steps_when_finite():
    data = batches(5)
    results = []
    for check_every, syncs in ((1, [True] * 5), (5, [False] * 4 + [True])):
        learner, opt, meta_step = parts(check_every)
        readings = [
            meta_step(b, i, 1e-2, sync=s) for i, (b, s) in enumerate(zip(data, syncs, strict=True))
        ]
        results.append((snapshot(learner, opt), readings[-1]))
    (plain, read_plain), (masked, read_masked) = results
    assert_same(plain, masked)
    assert read_masked.num_steps == 5 and read_plain.num_steps == 1
    assert read_masked.loss == read_plain.loss and read_masked.bad_step is None


def test_the_masked_update_keeps_its_copies_between_steps():
    """The copies are taken into buffers made once the optimizer's state exists, not
    cloned each step (on a GPU every clone is a launch of its own)."""
    data = batches(4)
    _, _, meta_step = parts(8)
    meta_step(data[0], 0, 1e-2, sync=False)  # the first step creates Adam's state
    meta_step(data[1], 1, 1e-2, sync=False)
    kept = [t.data_ptr() for t in meta_step._saved]
    meta_step(data[2], 2, 1e-2, sync=False)
    meta_step(poisoned(data[3]), 3, 1e-2, sync=False)
    assert [t.data_ptr() for t in meta_step._saved] == kept


def test_the_default_check_interval_follows_the_device():
    assert resolved_check_every(None, torch.device("cpu")) == 1
    assert resolved_check_every(None, torch.device("cuda", 0)) == 16
    assert resolved_check_every(3, torch.device("cuda", 0)) == 3


def tiny(run_dir, *overrides):
    return load_config([*TINY, f"run_dir={run_dir}", *overrides], world_size=1)


def test_a_run_reading_every_few_steps_stops_within_them_on_a_nan(tmp_path, monkeypatch):
    calls = []
    original = MetaStep.__call__

    def counting(self, batch, step, lr, *, sync):
        calls.append(step + 1)
        return original(self, batch, step, lr, sync=sync)

    monkeypatch.setattr(MetaStep, "__call__", counting)
    config = tiny(
        tmp_path / "run",
        "trainer.meta_steps=60",
        "trainer.check_every=5",
        "trainer.checkpoint_every=3",
        "logging.log_every=10",
        "optimizer=sgd",
        "optimizer.lr=1.0",
        "optimizer.momentum=0.0",
    )
    with pytest.raises(NonFiniteLossError, match=r"not finite at step (\d+)") as caught:
        train(config)
    failed_step = int(caught.value.args[0].split("at step ")[1].split()[0])
    assert failed_step <= calls[-1] < failed_step + 5  # stopped at the next read
    state = latest_checkpoint_state(config.resolved_run_dir)
    assert state["step"] < failed_step
    assert all(torch.isfinite(t).all() for t in state["learner"].values())
    assert f"step_{state['step']:08d}.pt" in str(caught.value)


def test_reading_every_few_steps_trains_the_same_run(tmp_path):
    every_step = train(tiny(tmp_path / "a", "trainer.meta_steps=7", "trainer.check_every=1"))
    every_few = train(tiny(tmp_path / "b", "trainer.meta_steps=7", "trainer.check_every=3"))
    for name, value in every_step.learner.state_dict().items():
        assert torch.equal(value, every_few.learner.state_dict()[name]), name
    assert every_step.loss == every_few.loss


def test_a_failed_compilation_says_so_once_and_runs_eagerly(tmp_path, monkeypatch, capsys):
    def broken_compile(fn, **kwargs):
        def call(*args):
            raise RuntimeError("backend exploded\nsecond line")

        return call

    monkeypatch.setattr(torch, "compile", broken_compile)
    compiled = train(tiny(tmp_path / "c", "trainer.meta_steps=4", "trainer.compile=true"))
    lines = [line for line in capsys.readouterr().err.splitlines() if "trainer.compile" in line]
    assert lines == [
        "trainer.compile: compiling the meta-step; the first steps take longer",
        "trainer.compile: cannot compile the meta-step (backend exploded); running eagerly",
    ]
    eager = train(tiny(tmp_path / "e", "trainer.meta_steps=4"))
    for name, value in eager.learner.state_dict().items():
        assert torch.equal(value, compiled.learner.state_dict()[name]), name


def test_compile_itself_raising_falls_back_too(monkeypatch):
    def refusing(fn, **kwargs):
        raise RuntimeError("no compiler")

    monkeypatch.setattr(torch, "compile", refusing)
    messages = []
    learner, opt, meta_step = parts(1, compile=True, message=messages.append)
    assert not meta_step.compiled and len(messages) == 1 and "no compiler" in messages[0]
    assert meta_step(batches(1)[0], 0, 1e-2, sync=True).bad_step is None


def test_bf16_autocast_trains_close_to_fp32():
    data = batches(3)
    losses = {}
    for precision in ("fp32", "bf16"):
        learner, opt, meta_step = parts(1, precision=precision)
        losses[precision] = [meta_step(b, i, 1e-2, sync=True).loss for i, b in enumerate(data)]
        assert all(p.dtype == torch.float32 for p in learner.parameters())
    assert losses["bf16"] != losses["fp32"]  # autocast took effect
    np.testing.assert_allclose(losses["bf16"], losses["fp32"], rtol=0.05)


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.precision=fp16", "trainer.precision must be one of fp32, bf16"),
        ("trainer.check_every=0", "trainer.check_every must be >= 1"),
        ("trainer.device=gpu", "trainer.device must be one of auto, cpu, cuda, cuda:N"),
        ("trainer.compile=maybe", "trainer.compile"),
    ],
)
def test_bad_step_options_are_named(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        tiny(tmp_path / "x", override)


def test_nccl_cannot_share_one_gpu_between_ranks(tmp_path):
    with pytest.raises(ValueError, match="NCCL cannot share"):
        load_config([*TINY, "trainer.device=cuda:0", "trainer.backend=nccl"], world_size=2)


@pytest.mark.slow
def test_compiled_first_order_meta_step_equals_eager_on_cpu():
    """Second-order MAML cannot compile (no double backward through compiled graphs);
    first-order can. Slow: compiling takes tens of seconds on a loaded 2-core machine."""
    data = batches(2)
    results = []
    for compile in (False, True):
        torch.manual_seed(0)
        model = build_model("mlp", (1,), (1,), hidden_sizes=(8,))
        learner = build_learner("maml", model, inner_steps=1, first_order=True)
        opt = torch.optim.Adam(learner.parameters(), lr=1e-2)
        messages = []
        meta_step = MetaStep(
            learner, learner, opt, DistEnv(), compile=compile, message=messages.append
        )
        losses = [meta_step(b, i, 1e-2, sync=True).loss for i, b in enumerate(data)]
        if compile and not meta_step.compiled:
            pytest.skip(f"torch.compile does not work on this CPU build: {messages}")
        results.append((losses, [p.detach().clone() for p in learner.parameters()]))
    (eager_losses, eager_params), (compiled_losses, compiled_params) = results
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-5)
    for a, b in zip(compiled_params, eager_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_a_run_is_evaluated_on_the_cpu_where_no_gpu_is_visible():
    from metadist.train.distributed import evaluation_device, read_env

    assert evaluation_device("auto") == evaluation_device("cuda") == torch.device("cpu")
    with pytest.raises(ValueError, match="trainer.device=cuda:0 but no GPU is visible"):
        read_env("cuda:0")


def test_compile_options_per_device():
    assert compile_options(torch.device("cpu")) == {"options": {"cpp_wrapper": True}}
    assert compile_options(torch.device("cuda")) == {"mode": "reduce-overhead"}
    assert compile_options(torch.device("meta")) == {}


def test_a_compiled_step_runs_its_first_step_eagerly_and_keeps_the_guard(monkeypatch):
    """`torch.compile` stubbed (it records its arguments; the "compiled" function runs as
    is): the first step runs eagerly, later ones through the compiled function with the
    learner's own host-sync check off, and a non-finite step is still refused."""
    compiled_with, compiled_calls = [], []

    def recording_compile(fn, **kwargs):
        compiled_with.append(kwargs)

        def run(batch):
            compiled_calls.append(learner.check_finite)
            return fn(batch)

        return run

    monkeypatch.setattr(torch, "compile", recording_compile)
    learner, opt, meta_step = parts(1, compile=True)
    assert meta_step.compiled and compiled_with == [compile_options(torch.device("cpu"))]
    data = batches(3)
    meta_step(data[0], 0, 1e-2, sync=True)
    assert compiled_calls == []
    assert meta_step(data[1], 1, 1e-2, sync=True).bad_step is None
    assert compiled_calls == [False] and learner.check_finite
    before = snapshot(learner, opt)
    reading = meta_step(poisoned(data[2]), 2, 1e-2, sync=True)
    assert reading.bad_step == 3 and compiled_calls == [False, False]
    assert_same(snapshot(learner, opt), before)
