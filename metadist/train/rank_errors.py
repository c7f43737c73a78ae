"""Which rank reports an error of a training on several ranks.

An error every rank meets alike (a bad config or component, a run directory of other
settings: found before the meta-steps, the same on each rank) is reported once, by local
rank 0. An error one rank meets in its meta-steps, on its own tasks (its sampler or model
failing on them, a batch of the wrong dtype), is that rank's alone: rank 0 only loses the
connection to it, so that rank reports it, naming itself (`raised_on`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from metadist.train.distributed import DistEnv
from metadist.train.finite import NonFiniteLossError

# the attribute that carries the rank on an error raised in the meta-steps
_RANK = "metadist_raised_on_rank"


@contextlib.contextmanager
def own_errors(env: DistEnv) -> Iterator[None]:
    """Marks an error raised inside the block on one rank of several as that rank's
    (not a non-finite meta-loss, which every rank raises together)."""
    try:
        yield
    except NonFiniteLossError:
        raise
    except Exception as error:
        if env.is_distributed:
            setattr(error, _RANK, env.rank)
        raise


def raised_on(error: BaseException) -> int | None:
    """The rank that met `error` alone in its meta-steps (`own_errors`), else `None`."""
    rank = getattr(error, _RANK, None)
    return rank if isinstance(rank, int) else None
