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
