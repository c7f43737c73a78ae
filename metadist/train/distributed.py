"""Process-group set-up from torchrun's environment, and the few collectives training needs.

Run alone, a process is rank 0 of a world of 1 and forms no process group. Under
`torchrun` (or Slurm's srun running torchrun), `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
`MASTER_ADDR` and `MASTER_PORT` are set; each rank takes one GPU (`cuda:LOCAL_RANK`) when
there are GPUs, else the CPU, and the backend follows the device: NCCL on GPU, gloo on
CPU. Both can be overridden (`trainer.device`, `trainer.backend`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in the run.

    Attributes:
        rank: global rank, 0..world_size-1.
        world_size: number of ranks.
        local_rank: rank on this machine (selects the GPU).
        device: the device this rank trains on.
        backend: the process-group backend (`gloo`/`nccl`), or `None` for a world of 1.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def read_env(device: str = "auto", backend: str = "auto") -> DistEnv:
    """This process's rank, world size, device and backend, before any process group forms.

    Args:
        device: `auto`, `cpu`, `cuda` (GPU `LOCAL_RANK`) or `cuda:N` (GPU N for every rank).
        backend: `auto`, `gloo` or `nccl`.

    Raises:
        ValueError: inconsistent torchrun variables, `cuda` asked for without a GPU, or
            NCCL asked for on CPU.
    """
    try:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as error:
        raise ValueError(
            f"bad torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {error}"
        ) from None
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"bad torchrun environment: RANK={rank}, WORLD_SIZE={world_size}")
    return rank_env(rank, world_size, local_rank, device, backend)


def rank_env(
    rank: int, world_size: int, local_rank: int, device: str = "auto", backend: str = "auto"
) -> DistEnv:
    """Where rank `rank` of `world_size` (`local_rank` on its machine) trains, with the
    settings `trainer.device` and `trainer.backend` (see `read_env`): what a launcher
    checks for its ranks before it starts them.

    Raises:
        ValueError: `cuda` asked for without a GPU (or without one for `local_rank`), or
            NCCL asked for on CPU.
    """
    cuda = torch.cuda.is_available()
    if device.startswith("cuda") and not cuda:
        raise ValueError(f"trainer.device={device} but no GPU is visible; use trainer.device=auto")
    if device.startswith("cuda:"):
        torch_device = torch.device(device)
        if torch_device.index >= torch.cuda.device_count():
            raise ValueError(
                f"trainer.device={device} but only {torch.cuda.device_count()} GPU(s) are visible"
            )
    elif device == "cuda" or (device == "auto" and cuda):
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPU(s) are "
                "visible: start at most one rank per GPU"
            )
        torch_device = torch.device("cuda", local_rank)
    else:
        torch_device = torch.device("cpu")
    chosen = backend
    if backend == "auto":
        chosen = "nccl" if torch_device.type == "cuda" else "gloo"
    if chosen == "nccl" and torch_device.type != "cuda":
        raise ValueError("trainer.backend=nccl needs a GPU per rank; use gloo on CPU")
    if chosen == "nccl" and device.startswith("cuda:") and world_size > 1:
        raise ValueError(
            f"trainer.device={device} puts every rank on one GPU, which NCCL cannot share "
            "between ranks; use trainer.backend=gloo"
        )
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=torch_device,
        backend=chosen if world_size > 1 else None,
    )


def evaluation_device(device: str = "auto") -> torch.device:
    """Where a trained run is evaluated: the first GPU when `trainer.device` allows one
    (`auto`, `cuda`) and one is visible, else the CPU (a run trained on a GPU is still
    evaluated on a machine without one)."""
    if device in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed(env: DistEnv, timeout_s: float = 600.0) -> None:
    """Forms the process group for `env` (nothing for a world of 1); sets the GPU.

    The rendezvous comes from torchrun's `MASTER_ADDR`/`MASTER_PORT` (`env://`).
    """
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if not env.is_distributed or dist.is_initialized():
        return
    timeout = timedelta(seconds=timeout_s)
    store, _, _ = next(
        dist.rendezvous("env://", rank=env.rank, world_size=env.world_size, timeout=timeout)
    )
    # After torchrun restarts the workers, the agent's store still holds the previous
    # attempt's keys (peer addresses), which new workers could read before they are
    # overwritten; a prefix per attempt keeps the attempts apart.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"metadist/attempt_{attempt}", store)
    dist.init_process_group(
        backend=env.backend,
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
        device_id=env.device if env.device.type == "cuda" else None,
    )


def destroy_distributed() -> None:
    """Tears the process group down, if one was formed. A peer gone first (its
    connection closed: the run is over on every rank) is not an error here."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except RuntimeError as error:
            if "connection" not in str(error).lower():
                raise


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sums `values` over ranks (in place when distributed) and returns it."""
    if env.is_distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_gather_objects(obj: object, env: DistEnv) -> list:
    """`[world_size]` list of every rank's `obj` (picklable)."""
    if not env.is_distributed:
        return [obj]
    gathered: list = [None] * env.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(env: DistEnv) -> None:
    """Waits until every rank gets here (nothing for a world of 1)."""
    if env.is_distributed:
        dist.barrier()
