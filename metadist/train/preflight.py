"""What the ranks of a launch on several processes would refuse as they start, found by
the process that launches them (`metadist train --nproc-per-node=N`): one line before
any process starts, rather than that line from a rank and torchrun's report after it.

`check_before_launch` checks the device and backend each rank would take (a GPU
asked for on a machine without enough), reads the components' options, builds the task source (store,
sampler, split) and the meta-train and meta-val loaders of rank 0 at the launch's world
size, and confirms that the run directory is not a store, can take the run's logs
(`check_log_sinks`), holds no run of other settings and is not in use by another
training (`RunLock`). Its notes are left to the ranks, which
print them again.
"""

from __future__ import annotations

import contextlib
import gc
import io

from metadist.runlock import RunLock
from metadist.store.format import is_store
from metadist.train.build import build_loaders, build_task_source, check_components
from metadist.train.checkpoint import latest_checkpoint, load_checkpoint
from metadist.train.config import TrainConfig
from metadist.train.distributed import DistEnv, rank_env
from metadist.train.log_sinks import check_log_sinks
from metadist.train.resume import check_same_run, check_same_store_path


def check_before_launch(config: TrainConfig, world_size: int) -> None:
    """Raises what a rank of a `world_size`-process training of `config` would raise
    before its first meta-step (see the module).

    Raises:
        ValueError, FileNotFoundError: naming the setting at fault.
    """
    last = world_size - 1  # the rank that needs the most GPUs of this machine
    rank_env(last, world_size, last, config.trainer.device, config.trainer.backend)
    run_dir = config.resolved_run_dir
    if is_store(run_dir):
        raise ValueError(
            f"run_dir {run_dir} is a series store; a run needs a directory of its own, "
            "e.g. run_dir=runs/NAME"
        )
    check_log_sinks(run_dir, config.logging)
    if run_dir.is_dir():  # another training writes to it: refused now, not by rank 0
        with RunLock(run_dir):
            pass
    check_components(config)
    with contextlib.redirect_stderr(io.StringIO()):  # the ranks print the notes
        source = build_task_source(config, verify_store=False)
        loaders = build_loaders(config, DistEnv(rank=0, world_size=world_size), source)
    del loaders, source  # the launcher only waits from here: free them now
    gc.collect()
    found = latest_checkpoint(run_dir)
    if found is not None:
        state = load_checkpoint(*found)
        check_same_run(state.get("config", {}), config.to_dict(), run_dir)
        check_same_store_path(state, config.data.store, run_dir)
