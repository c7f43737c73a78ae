"""CUDA: every learner × model, training, resume, DDP and evaluation on a GPU.

Marked `gpu` and skipped where no GPU is visible, so `make test` stays green on CPU
machines. On a GPU machine: `.venv/bin/python -m pytest -m gpu -q -rs`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from gloo_ranks import free_port, set_rank_env
from test_train_step import poisoned

from metadist.batch import MetaBatch, TaskSet, cat_batches
from metadist.learners import build_learner, get_learner, registered_learners
from metadist.models import build_model, registered_models

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TINY = [
    "experiment=sinusoid_maml",
    "sampler.options.num_tasks=64",
    "model.options.hidden_sizes=[8]",
    "trainer.meta_batch_size=8",
    "trainer.eval_batches=2",
    "logging.progress=false",
    "logging.wandb.mode=disabled",
    "logging.log_every=2",
]
SMALL = {
    "mlp": {"hidden_sizes": (8,)},
    "forecaster": {"hidden_sizes": (8,)},
    "tcn": {"channels": 4, "num_levels": 2},
    "transformer": {"d_model": 8, "num_heads": 2, "num_layers": 1, "ff_size": 8},
    "gru": {"hidden_size": 4},
    "nbeats": {"blocks_per_stack": 2, "width": 8},
}


@pytest.fixture(autouse=True)
def exact_float32():
    """Full-precision float32 matmuls and convolutions (no TF32), so paths compare tightly."""
    matmul, conv = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, conv


def _batch(support_x, support_y, query_x, query_y) -> MetaBatch:
    num_tasks = support_x.shape[0]
    return MetaBatch(
        support=TaskSet(support_x, support_y),
        query=TaskSet(query_x, query_y),
        entity_index=torch.full((num_tasks,), -1),
        stratum=torch.zeros(num_tasks, dtype=torch.int64),
        split_time=torch.full((num_tasks,), -1),
    )


def _model_and_batch(learner_name: str, model_name: str):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if not get_learner(learner_name).has_inner_loop:  # an embedding network, classifying
        model = build_model(model_name, (6, 2), (4,), **SMALL[model_name])
        y = torch.arange(3).repeat_interleave(2).repeat(4, 1)
        x = torch.randn(4, 6, 6, 2, generator=g) + y[..., None, None] * 0.5
        return model, _batch(x, y, x.flip(1), y.flip(1))
    model = build_model(model_name, (6, 2), (2, 1), **SMALL[model_name])
    return model, _batch(
        torch.randn(4, 4, 6, 2, generator=g),
        torch.randn(4, 4, 2, 1, generator=g),
        torch.randn(4, 5, 6, 2, generator=g),
        torch.randn(4, 5, 2, 1, generator=g),
    )


def _meta_step(learner, batch):
    learner.zero_grad()
    out = learner(batch)
    out.loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in learner.named_parameters()}
    with torch.no_grad():
        adapted = learner.adapt(batch.support, steps=2)
        prediction = learner.predict(adapted, batch.query.x).cpu()
    return out.loss.detach().cpu(), grads, prediction


@pytest.mark.parametrize("model_name", registered_models())
@pytest.mark.parametrize("learner_name", registered_learners())
def test_every_learner_and_model_batched_equals_the_loop_on_cuda(learner_name, model_name):
    model, batch = _model_and_batch(learner_name, model_name)
    inner_loop = get_learner(learner_name).has_inner_loop
    options = {"inner_steps": 2} if inner_loop and learner_name != "reptile" else {}
    device = torch.device("cuda")
    results = {}
    for place, vectorize in (("cuda", True), ("cuda", False), ("cpu", True)):
        target = device if place == "cuda" else torch.device("cpu")
        torch.manual_seed(0)
        learner = build_learner(learner_name, model, vectorize=vectorize, **options)
        learner = learner.to(target)
        results[(place, vectorize)] = _meta_step(learner, batch.to(target))
        model = model.cpu()
    reference = results[("cuda", False)]
    # The fine-tuning and Adam inner loops (metabaseline_*) amplify rounding: an Adam step
    # divides by the gradient's own size, so a near-zero gradient's rounding moves a
    # weight by up to a whole step (tests/test_learners.py allows 10x on the CPU; between
    # the GPU's and the CPU's products an H200 showed 1.15e-4 on one element of 8).
    factor = 50.0 if learner_name.startswith("metabaseline_") else 1.0
    rtol, atol = 1e-4 * factor, 1e-5 * factor
    for key in (("cuda", True), ("cpu", True)):
        loss, grads, prediction = results[key]
        torch.testing.assert_close(loss, reference[0], rtol=rtol, atol=atol)
        for name in grads:
            torch.testing.assert_close(grads[name], reference[1][name], rtol=rtol, atol=atol)
        torch.testing.assert_close(prediction, reference[2], rtol=rtol, atol=atol)


def _config(run_dir, *overrides):
    from metadist.train import load_config

    return load_config([*TINY, f"run_dir={run_dir}", "trainer.device=cuda", *overrides])


def _params(learner) -> dict[str, torch.Tensor]:
    return {n: v.detach().cpu().clone() for n, v in learner.state_dict().items()}


@pytest.mark.timeout(600)
def test_training_on_cuda_stops_and_resumes_exactly(tmp_path):
    from metadist.train import latest_checkpoint_state, train

    schedule = ["trainer.meta_steps=14", "trainer.eval_every=6", "trainer.checkpoint_every=4"]
    reference = train(_config(tmp_path / "straight", *schedule))
    assert next(reference.learner.parameters()).is_cuda

    def sigterm_at_six(step, values):
        if step == 6:
            os.kill(os.getpid(), signal.SIGTERM)

    config = _config(tmp_path / "stopped", *schedule)
    first = train(config, on_eval=sigterm_at_six)
    assert first.stopped_by == "SIGTERM" and first.step < 14
    state = latest_checkpoint_state(config.resolved_run_dir)
    assert "cuda" in state["rng"][0]  # the GPU's generator is saved with the CPU's
    second = train(config)
    assert second.step == 14
    for name, value in _params(reference.learner).items():
        torch.testing.assert_close(_params(second.learner)[name], value, rtol=1e-6, atol=1e-7)


@pytest.mark.timeout(600)
def test_a_nan_on_cuda_is_never_applied_and_stops_the_run(tmp_path, monkeypatch):
    from metadist.train import NonFiniteLossError, latest_checkpoint_state, train
    from metadist.train.step import MetaStep

    # One meta-batch (the 8th step's) carries a NaN target: deterministic, unlike a
    # learning rate large enough to diverge, whose first bad step varies by device.
    original = MetaStep.__call__

    def poisoning(self, batch, step, lr, *, sync):
        return original(self, poisoned(batch) if step == 7 else batch, step, lr, sync=sync)

    monkeypatch.setattr(MetaStep, "__call__", poisoning)
    config = _config(
        tmp_path / "run",
        "trainer.meta_steps=60",
        "trainer.checkpoint_every=3",
        "logging.log_every=30",
    )
    assert config.trainer.check_every is None  # the GPU default: a read every 16 steps
    with pytest.raises(NonFiniteLossError, match=r"not finite at step 8\b"):
        train(config)
    state = latest_checkpoint_state(config.resolved_run_dir)
    assert state["step"] == 6  # the read at step 9's checkpoint found it; nothing saved
    assert all(torch.isfinite(t).all() for t in state["learner"].values())


def test_the_loader_pins_batches_for_the_gpu(tmp_path):
    from metadist.train.build import build_parts
    from metadist.train.distributed import read_env

    parts = build_parts(_config(tmp_path / "run"), read_env("cuda"))
    batch = next(iter(parts.train_loader))
    assert batch.support.x.is_pinned() and batch.query.y.is_pinned()


@pytest.mark.timeout(600)
def test_evaluation_runs_on_the_gpu_and_matches_the_cpu(tmp_path, monkeypatch):
    from metadist.eval import evaluate_run
    from metadist.train import distributed, train

    run = train(_config(tmp_path / "run", "trainer.meta_steps=4"))
    overrides = ["eval.max_tasks=50", "eval.scratch_steps=2", "eval.batch_size=25"]
    on_gpu = evaluate_run(run.run_dir, overrides=overrides, write=False)
    monkeypatch.setattr(distributed, "evaluation_device", lambda device="auto": torch.device("cpu"))
    on_cpu = evaluate_run(run.run_dir, overrides=overrides, write=False)
    for method in ("adapted", "unadapted"):
        gpu, cpu = (
            on_gpu["overall"][method]["mse"]["value"],
            on_cpu["overall"][method]["mse"]["value"],
        )
        assert gpu == pytest.approx(cpu, rel=1e-4)


@pytest.mark.timeout(900)
def test_compiled_meta_step_equals_eager_on_cuda():
    import numpy as np

    from metadist.tasks import build_task_sampler, derive_task_seeds
    from metadist.train.distributed import DistEnv
    from metadist.train.step import MetaStep

    sampler = build_task_sampler("sinusoid", num_support=10, num_query=10)
    data = []
    for i in range(4):
        positions = np.arange(i * 25, (i + 1) * 25)
        data.append(sampler.sample(positions, derive_task_seeds(0, 0, positions)).to("cuda"))
    env = DistEnv(device=torch.device("cuda", torch.cuda.current_device()))
    results = []
    for compile in (False, True):
        torch.manual_seed(0)
        model = build_model("mlp", (1,), (1,), hidden_sizes=(40, 40))
        learner = build_learner("maml", model, inner_steps=1, first_order=True).to(env.device)
        optimizer = torch.optim.Adam(learner.parameters(), lr=1e-3)
        messages = []
        meta_step = MetaStep(
            learner,
            learner,
            optimizer,
            env,
            compile=compile,
            check_every=16,
            message=messages.append,
        )
        for i, batch in enumerate(data):
            meta_step(batch, i, 1e-3, sync=i == len(data) - 1)
        assert meta_step.compiled == compile, messages
        results.append(_params(learner))
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, rtol=1e-5, atol=1e-6)


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str, device: str) -> None:
    set_rank_env(rank, world_size, port)
    from torch.nn.parallel import DistributedDataParallel

    from metadist.train import load_config, train
    from metadist.train.build import build_parts
    from metadist.train.distributed import destroy_distributed, init_distributed, read_env

    backend = "nccl" if device == "cuda" else "gloo"
    env = read_env(device, backend)
    init_distributed(env)
    overrides = [*TINY, f"trainer.device={device}", f"trainer.backend={backend}"]
    parts = build_parts(load_config(overrides, world_size=world_size), env)
    model = DistributedDataParallel(parts.learner, device_ids=[env.device])
    batch = next(iter(parts.train_loader))
    parts.optimizer.zero_grad()
    model(batch.to(env.device)).loss.backward()
    grads = {n: p.grad.cpu() for n, p in parts.learner.named_parameters()}
    run = [*overrides, "trainer.meta_steps=40", "trainer.checkpoint_every=10"]
    trained = train(load_config([*run, f"run_dir={Path(out_dir) / 'run'}"], world_size=world_size))
    results = {"batch": batch, "grads": grads, "trained": _params(trained.learner)}
    results["backend"] = backend
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    destroy_distributed()


@pytest.mark.timeout(900)
def test_two_ranks_on_cuda_match_one_process(tmp_path):
    """NCCL when there are two GPUs; on one GPU (which NCCL cannot share between ranks)
    two gloo ranks on CUDA tensors."""
    from metadist.train import load_config
    from metadist.train.build import build_parts
    from metadist.train.distributed import read_env

    device = "cuda" if torch.cuda.device_count() >= 2 else "cuda:0"
    torch.multiprocessing.start_processes(
        _ddp_worker,
        args=(2, free_port(), str(tmp_path), device),
        nprocs=2,
        start_method="spawn",
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    union = cat_batches([ranks[0]["batch"], ranks[1]["batch"]])
    parts = build_parts(load_config([*TINY, "trainer.device=cuda"], world_size=1), read_env("cuda"))
    parts.optimizer.zero_grad()
    parts.learner(union.to("cuda")).loss.backward()
    for name, param in parts.learner.named_parameters():
        torch.testing.assert_close(ranks[0]["grads"][name], param.grad.cpu(), rtol=1e-5, atol=1e-6)
        assert torch.equal(ranks[0]["grads"][name], ranks[1]["grads"][name])
    for name, value in ranks[0]["trained"].items():
        assert torch.equal(value, ranks[1]["trained"][name]), name
