"""Meta-training across real processes: 2 gloo ranks, torchrun restarts, signals.

* DDP's averaged meta-gradient on 2 ranks equals one process's gradient on the union of
  the two ranks' tasks, for every gradient-based learner; Reptile's update likewise.
* Replicas stay bit-identical over several steps.
* SIGTERM → checkpoint → clean exit; the same command resumes bit-identically.
* A rank SIGKILLed under `torchrun --max-restarts=1` is restarted, resumes from the latest
  checkpoint and ends with the parameters of an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from gloo_ranks import free_port, set_rank_env

from metadist.batch import cat_batches

pytestmark = pytest.mark.integration

TINY = [
    "experiment=sinusoid_maml",
    "sampler.options.num_tasks=64",
    "model.options.hidden_sizes=[8]",
    "logging.progress=false",
    "logging.wandb.mode=disabled",
    "logging.log_every=5",
    "trainer.eval_every=0",
]
GLOBAL_BATCH = ["trainer.meta_batch_size=8"]
# The 2-rank run trained by the spawned workers, and repeated under torchrun with a rank
# killed: both must end with the same parameters.
TWO_RANK_RUN = [*TINY, *GLOBAL_BATCH, "trainer.meta_steps=60", "trainer.checkpoint_every=5"]
LEARNERS = {
    "maml": ["learner=maml"],
    "fomaml": ["learner=fomaml"],
    "metasgd": ["learner=metasgd"],
    "anil": ["learner=anil"],
    "reptile": [
        "learner=reptile",
        "learner.options.inner_steps=3",
        "optimizer=sgd",
        "optimizer.momentum=0.0",
        "optimizer.lr=0.5",
    ],
}


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    set_rank_env(rank, world_size, port)
    torch.set_num_threads(1)
    from torch.nn.parallel import DistributedDataParallel

    from metadist.train import load_config, train
    from metadist.train.build import build_parts
    from metadist.train.distributed import destroy_distributed, init_distributed, read_env

    env = read_env("cpu", "gloo")
    init_distributed(env)
    results = {}
    for name, overrides in LEARNERS.items():
        parts = build_parts(load_config([*TINY, *GLOBAL_BATCH, *overrides]), env)
        model = DistributedDataParallel(parts.learner)
        batch = next(iter(parts.train_loader))
        parts.optimizer.zero_grad()
        model(batch).loss.backward()  # what the training loop does, once per meta-step
        grads = {n: p.grad.clone() for n, p in parts.learner.named_parameters()}
        parts.optimizer.step()
        results[name] = {"batch": batch, "grads": grads, "after": _params(parts.learner)}
    run_dir = Path(out_dir) / "run"
    trained = train(load_config([*TWO_RANK_RUN, f"run_dir={run_dir}"]))
    results["trained"] = _params(trained.learner)
    # The same run reading the step guard every 7 steps (masked updates in between, the
    # GPU default's path) ends with the same parameters.
    masked_dir = Path(out_dir) / "masked"
    masked = train(load_config([*TWO_RANK_RUN, "trainer.check_every=7", f"run_dir={masked_dir}"]))
    results["masked"] = _params(masked.learner)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    destroy_distributed()


def _params(learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.named_parameters()}


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ddp")
    torch.multiprocessing.start_processes(
        _ddp_worker,
        args=(2, free_port(), str(out_dir)),
        nprocs=2,
        start_method="spawn",
    )
    ranks = [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return {"ranks": ranks, "run_dir": out_dir / "run"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("learner", list(LEARNERS))
def test_two_ranks_match_one_process_on_the_union_of_tasks(two_rank_results, learner):
    from metadist.train import load_config
    from metadist.train.build import build_parts
    from metadist.train.distributed import read_env

    rank0, rank1 = (r[learner] for r in two_rank_results["ranks"])
    assert rank0["batch"].num_tasks == rank1["batch"].num_tasks == 4
    assert not torch.equal(rank0["batch"].support.x, rank1["batch"].support.x)
    union = cat_batches([rank0["batch"], rank1["batch"]])

    parts = build_parts(
        load_config([*TINY, *GLOBAL_BATCH, *LEARNERS[learner]], world_size=1), read_env("cpu")
    )
    parts.optimizer.zero_grad()
    parts.learner(union).loss.backward()
    # fp32, within 1e-6: absolutely, or relatively for entries larger than 1 (Meta-SGD's
    # step-size gradients reach ~25, where 1e-6 is below one float32 ulp).
    for name, param in parts.learner.named_parameters():
        assert param.grad is not None, name
        torch.testing.assert_close(rank0["grads"][name], param.grad, rtol=1e-6, atol=1e-6)
        assert torch.equal(rank0["grads"][name], rank1["grads"][name])  # one all-reduce
    if learner == "reptile":
        before = _params(parts.learner)
        parts.optimizer.step()
        after = _params(parts.learner)
        for name in after:
            assert not torch.equal(after[name], before[name])
            torch.testing.assert_close(rank0["after"][name], after[name], rtol=1e-6, atol=1e-6)


@pytest.mark.timeout(300)
def test_replicas_stay_identical_over_several_steps(two_rank_results):
    rank0, rank1 = (r["trained"] for r in two_rank_results["ranks"])
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    for rank in two_rank_results["ranks"]:  # guard read every 7 steps: the same run
        for name in rank0:
            assert torch.equal(rank["masked"][name], rank0[name]), name


def _final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    from metadist.train import latest_checkpoint_state

    return latest_checkpoint_state(run_dir)["learner"]


def _wait_for_checkpoint(run_dir: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (run_dir / "checkpoints" / "latest").exists():
        if process.poll() is not None:
            raise AssertionError(f"run ended (rc {process.returncode}) before a checkpoint")
        if time.monotonic() > deadline:
            raise AssertionError("no checkpoint appeared")
        time.sleep(0.02)


def _assert_same_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.timeout(240)
def test_sigterm_checkpoints_exits_cleanly_and_the_same_command_resumes(tmp_path):
    from metadist.train import latest_checkpoint_state, load_config, train

    schedule = ["trainer.meta_steps=80", "trainer.checkpoint_every=5", "trainer.meta_batch_size=4"]
    run_dir = tmp_path / "stopped"
    command = [
        sys.executable,
        "-m",
        "metadist.train",
        "--no-eval",
        *TINY,
        *schedule,
        f"run_dir={run_dir}",
    ]
    stopped = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_checkpoint(run_dir, stopped)
        stopped.send_signal(signal.SIGTERM)
        _, err = stopped.communicate(timeout=60)
    finally:
        if stopped.poll() is None:
            stopped.kill()
    assert stopped.returncode == 0, err
    assert "SIGTERM: checkpoint of step" in err and "Traceback" not in err
    stop_step = latest_checkpoint_state(run_dir)["step"]
    assert 5 <= stop_step < 80

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {run_dir}" in resumed.stderr and f"at step {stop_step}" in resumed.stderr
    assert latest_checkpoint_state(run_dir)["step"] == 80
    straight = train(load_config([*TINY, *schedule, f"run_dir={tmp_path / 'straight'}"]))
    _assert_same_params(_final_params(run_dir), straight.learner.state_dict())


def _worker_pid(agent_pid: int, rank: int) -> int | None:
    """The pid of the torchrun worker of `rank` started by the agent `agent_pid`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if parent == agent_pid and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    not Path("/proc/self/environ").exists(),
    reason="finds the rank to kill in /proc/<pid>/environ (Linux only)",
)
def test_rank_killed_under_torchrun_restarts_and_finishes_like_an_uninterrupted_run(
    tmp_path, two_rank_results
):
    from metadist.train import latest_checkpoint_state

    run_dir = tmp_path / "killed"
    command = [
        *[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
        *["--max-restarts=1", "--monitor-interval=0.2"],
        *["-m", "metadist.train", "--no-eval", *TWO_RANK_RUN, f"run_dir={run_dir}"],
    ]
    killed = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_checkpoint(run_dir, killed)
        victim = _worker_pid(killed.pid, rank=1)
        assert victim is not None, "rank 1 worker not found"
        os.kill(victim, signal.SIGKILL)
        output, _ = killed.communicate(timeout=240)
    finally:
        if killed.poll() is None:
            killed.kill()
    assert killed.returncode == 0, output[-3000:]
    assert "resumed from" in output, output[-3000:]
    assert latest_checkpoint_state(run_dir)["step"] == 60
    # The uninterrupted reference: the same 2-rank run, trained by the spawned workers.
    _assert_same_params(_final_params(run_dir), _final_params(two_rank_results["run_dir"]))
