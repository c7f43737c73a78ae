"""Evaluation sharded across processes: each rank predicts a deterministic share of the
batches, rank 0 scores them all and writes the report.

Under torchrun (`metadist eval ... --nproc-per-node N`), `EvalShard.from_env()` forms a
gloo process group. Every rank draws the same batches (the evaluation tasks are seeded)
and predicts the meta-trained model's and the from-scratch baseline's predictions (the
costly part) of the batches it claims: the next batch not yet claimed by any rank, from
a counter in the process group's store, so a rank slowed by other work (rank 0 trains
the pretrained embedding first) claims fewer. Rank 0 gathers the predictions and scores
every batch in the original order with the same code as one process (the cheap
classification baselines, statistical forecasts, metrics, the figure's examples), so
the report is the one a single process writes: each batch's predictions are computed by
the same operations on the same inputs whichever rank computes them (a test checks it).

On a GPU machine each rank evaluates on `cuda:LOCAL_RANK`; the collectives carry only
CPU objects (gloo).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from metadist.batch import MetaBatch

# A rank may wait this long for the others at a collective (rank 0 pretraining the
# embedding, or scoring a share larger than theirs).
_TIMEOUT = timedelta(hours=6)
# A batch's predictions, by method: `{method: array}`.
Arrays = dict[str, np.ndarray]


class EvalShard:
    """This process's place in a sharded evaluation (rank 0 of 1 when alone).

    Attributes:
        rank: this process's rank, `0..world_size-1`.
        world_size: the number of processes sharing the evaluation.
    """

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"bad evaluation shard: rank {rank} of {world_size}")
        self.rank = rank
        self.world_size = world_size
        self._formed = False
        # the process group's store, whose counter hands out the batches (`claim`)
        self._store: Any = None
        self._claimed = -1
        # on rank 0 after `predict_share`: how many batches each rank predicted
        self.batches_per_rank: list[int] = []

    @classmethod
    def from_env(cls) -> EvalShard:
        """The shard torchrun's `RANK`/`WORLD_SIZE` describe, its gloo process group
        formed (none for a world of 1), and this rank's GPU selected where there is one
        (`LOCAL_RANK`).

        Raises:
            ValueError: inconsistent torchrun variables.
        """
        try:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
            rank = int(os.environ.get("RANK", "0"))
            local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        except ValueError as error:
            raise ValueError(f"bad torchrun environment (RANK/WORLD_SIZE): {error}") from None
        shard = cls(rank, world_size)
        if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
            torch.cuda.set_device(local_rank)  # `evaluation_device` takes the current GPU
        if world_size > 1 and not dist.is_initialized():
            store, _, _ = next(
                dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=_TIMEOUT)
            )
            store = dist.PrefixStore("metadist/eval", store)
            dist.init_process_group(
                "gloo", store=store, rank=rank, world_size=world_size, timeout=_TIMEOUT
            )
            shard._formed, shard._store = True, store
        return shard

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_sharded(self) -> bool:
        return self.world_size > 1

    def owns(self, index: int) -> bool:
        """Whether batch `index` (0-based, in the tasks' order) is this rank's: claimed
        by it (`claim`) where the ranks share a store, else every `world_size`-th."""
        if self._store is None and self.is_sharded:
            return index % self.world_size == self.rank
        while self._claimed < index:
            self._claimed = self.claim()
        return self._claimed == index

    def claim(self) -> int:
        """The next batch no rank has claimed (alone: the next batch)."""
        if self._store is None:
            return self._claimed + 1
        return int(self._store.add("next_batch", 1)) - 1

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's `value` (picklable), in rank order, on rank 0; `None` elsewhere."""
        if not self.is_sharded:
            return [value]
        gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(value, gathered, dst=0)
        return gathered

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` (picklable), on every rank."""
        if not self.is_sharded:
            return value
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def describe(self) -> str:
        """The processes and what each did, as the report's settings give it."""
        done = ", ".join(str(n) for n in self.batches_per_rank)
        idle = sum(1 for n in self.batches_per_rank if n == 0)
        note = (
            f"; {idle} had none: fewer batches than processes (a smaller eval.batch_size, "
            "or fewer processes)"
            if idle
            else ""
        )
        return f"{self.world_size} (batches predicted by each: {done}{note})"

    def close(self) -> None:
        """Tears down the process group `from_env` formed."""
        if self._formed and dist.is_initialized():
            dist.destroy_process_group()
        self._formed = False


class Reiterable:
    """Batches that can be drawn again (`factory()` gives a fresh iterator of the same
    batches: seeded tasks), as a sharded evaluation's rank 0 draws them twice."""

    def __init__(self, factory: Callable[[], Iterator[MetaBatch]]) -> None:
        self.factory = factory

    def __iter__(self) -> Iterator[MetaBatch]:
        return self.factory()


def predict_share(
    shard: EvalShard,
    batches: Iterable[MetaBatch],
    predict: Callable[[MetaBatch], Arrays],
    start: Callable[[MetaBatch], None] | None = None,
) -> dict[int, Arrays] | None:
    """Predicts this rank's batches and gathers every rank's predictions on rank 0.

    Args:
        shard: this process's shard.
        batches: every batch of the evaluation, in order (each rank draws them until it
            has claimed one past the last).
        predict: `batch -> {method: [B, ...] array}`.
        start: rank 0 only: called with every batch first (the statistical forecasts
            start on its worker processes while the ranks predict).

    Returns:
        On rank 0, `{batch index: predictions}` of every batch; `None` elsewhere.
    """
    mine: dict[int, Arrays] = {}
    for index, batch in enumerate(batches):
        if start is not None and shard.is_main:
            start(batch)
        if shard.owns(index):
            mine[index] = predict(batch)
    gathered = shard.gather(mine)
    if gathered is None:
        return None
    every: dict[int, Arrays] = {}
    for share in gathered:
        every.update(share)
    shard.batches_per_rank = [len(share) for share in gathered]
    return every
