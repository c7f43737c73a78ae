"""A distributed training leaves nothing to gloo's shutdown: no DDP wrapper outlives it.

`train` forms the process group and tears it down. The DDP wrapper of the loop sits in
reference cycles and holds the group; left to the collector it was freed at interpreter
exit, when gloo's threads touching Python objects abort a rank now and then
("terminate called without an active exception", after the run had finished). The loop
collects it before the group is destroyed: two real gloo ranks check that none is alive.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
from gloo_ranks import free_port, set_rank_env
from torch.nn.parallel import DistributedDataParallel

import metadist.train.loop as train_loop
from metadist.train import load_config, train

pytestmark = pytest.mark.integration

TINY_TWO_RANKS = [
    "experiment=sinusoid_maml",
    "sampler.options.num_tasks=64",
    "model.options.hidden_sizes=[8]",
    "logging.progress=false",
    "logging.wandb.mode=disabled",
    "trainer.eval_every=0",
    "trainer.meta_batch_size=4",
    "trainer.meta_steps=2",
]


def _live_ddp_wrappers() -> int:
    return sum(isinstance(obj, DistributedDataParallel) for obj in gc.get_objects())


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    set_rank_env(rank, world_size, port)
    torch.set_num_threads(1)
    seen: list[int] = []
    destroy = train_loop.destroy_distributed

    def counting_destroy() -> None:
        seen.append(_live_ddp_wrappers())
        destroy()

    train_loop.destroy_distributed = counting_destroy
    train(load_config([*TINY_TWO_RANKS, f"run_dir={Path(out_dir) / 'run'}"]))
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.mark.timeout(180)
def test_no_ddp_wrapper_is_alive_when_the_process_group_is_destroyed(tmp_path):
    torch.multiprocessing.start_processes(
        _worker, args=(2, free_port(), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    for rank in range(2):
        # One teardown per rank, with no DDP wrapper left for interpreter exit to free.
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [0], rank


def test_a_peer_gone_after_the_last_barrier_is_not_a_failure(monkeypatch):
    """On an orderly stop, a rank past the last barrier may close its connection before
    its peer read the last message: that peer's "Connection reset by peer" was printed as
    a lost peer (1 stop in about 20). It is tolerated only where every rank recorded in
    the group's store that it finished; a peer that crashed first, or another error,
    still raises."""
    import torch.distributed as dist

    from metadist.train import loop
    from metadist.train.distributed import DistEnv

    store = dist.HashStore()
    monkeypatch.setattr(loop, "_group_store", lambda: store)
    env = DistEnv(rank=1, world_size=2, local_rank=1, backend="gloo")

    def reset(env):
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection reset by peer")

    monkeypatch.setattr(loop, "barrier", reset)
    with pytest.raises(RuntimeError, match="Connection reset"):
        loop._leave_together(env)  # rank 0 never recorded that it finished: it crashed
    loop._leave_together(env, stopped=True)  # a stop all ranks agreed on: checkpointed
    store.set("metadist/finished/0", "1")
    loop._leave_together(env)  # both finished: the reset loses nothing

    def other(env):
        raise RuntimeError("Timed out waiting 1800000ms for recv operation to complete")

    monkeypatch.setattr(loop, "barrier", other)
    with pytest.raises(RuntimeError, match="Timed out"):
        loop._leave_together(env)
