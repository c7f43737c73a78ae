"""A meta-loss that is not finite, and whose fault it is: the data's where a task's
windows hold NaN or inf (named by entity and store), else the training's."""

from __future__ import annotations

import torch

from metadist.batch import MetaBatch
from metadist.tasks import TaskSampler
from metadist.train.distributed import DistEnv, all_gather_objects


class NonFiniteLossError(RuntimeError):
    """The meta-loss became NaN or infinite; the run stopped before applying the step."""


def check_inputs_finite(batch: MetaBatch, sampler: TaskSampler, step: int, env: DistEnv) -> None:
    """Blames the data, not the learning rate, when a task's inputs hold NaN/inf.

    Collective: every rank calls it once the ranks agreed that the loss is not finite,
    so the error names the entities of every rank's batch, whichever rank reports it.

    Raises:
        NonFiniteLossError: naming the entities whose windows are not finite.
    """
    tensors = (batch.support.x, batch.support.y, batch.query.x, batch.query.y)
    bad = torch.zeros(batch.num_tasks, dtype=torch.bool, device=batch.support.x.device)
    for tensor in tensors:
        if tensor.is_floating_point():
            bad |= ~torch.isfinite(tensor.reshape(batch.num_tasks, -1)).all(dim=1)
    local = batch.entity_index.cpu()[bad.cpu()].tolist()
    rows = sorted({row for rank_rows in all_gather_objects(local, env) for row in rank_rows})
    if not rows:
        return
    store = getattr(sampler, "store", None)
    if store is not None and rows[0] >= 0:
        names = ", ".join(repr(str(store.entity_ids[r])) for r in rows[:5])
        more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
        where = f"entity {names}{more} of store {store.path} (run metadist verify on it)"
    else:
        where = "tasks of the batch"
    raise NonFiniteLossError(
        f"the meta-loss is not finite at step {step + 1} because the input data is: "
        f"NaN or inf values in the windows of {where}; the step was not applied"
    )
