"""The loader's resumable position: an epoch and the tasks all ranks consumed in it.

Because every step consumes a prefix of the epoch's global order (`metadist.data.dealing`),
`(epoch, tasks_consumed)` is the whole position of a run's data, the same on every rank,
and valid under another world size or batch size. The state saves what it depends on
(the seed, the split's size, the order's settings), so a resume that would deal other
tasks is refused.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from metadist.data.dealing import UnitDealer

STATE_VERSION = 1


def order_text(dealer: UnitDealer) -> str:
    """The dealer's order and its settings, as saved in the state."""
    if dealer.order == "random":
        return "random"
    return f"blocked(block_bytes={dealer.block_bytes}, window_blocks={dealer.window_blocks})"


def position_state(
    epoch: int, tasks_consumed: int, seed: int, dealer: UnitDealer
) -> dict[str, Any]:
    """`{"version", "epoch", "tasks_consumed", "seed", "num_tasks_per_epoch", "order"}`."""
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "tasks_consumed": tasks_consumed,
        "seed": seed,
        "num_tasks_per_epoch": dealer.num_units,
        "order": order_text(dealer),
    }


def read_position_state(
    state: Mapping[str, Any], seed: int, dealer: UnitDealer, split: str
) -> tuple[int, int]:
    """`(epoch, tasks_consumed)` of a saved `state`, checked against this loader's.

    Raises:
        ValueError: a state missing the position, from another seed, order or split size,
            or a position outside the epoch.
    """
    if not isinstance(state, Mapping):
        raise ValueError(
            f"loader state must be a mapping (a loader's state_dict()), got {type(state).__name__}"
        )
    for key in ("epoch", "tasks_consumed", "seed", "num_tasks_per_epoch"):
        value = state.get(key, 0)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise ValueError(f"loader state {key}={value!r} is not an integer")
    missing = {"epoch", "tasks_consumed"} - set(state)
    if missing:
        raise ValueError(f"loader state is missing {sorted(missing)}")
    if "seed" in state and int(state["seed"]) != seed:
        raise ValueError(
            f"loader state was saved with seed={state['seed']}, this loader has seed={seed}"
        )
    saved_order = str(state.get("order", "random"))
    if saved_order != order_text(dealer):
        raise ValueError(
            f"loader state was saved with order {saved_order}, this loader has "
            f"{order_text(dealer)}; resume with the same data.order settings"
        )
    num_units = dealer.num_units
    if "num_tasks_per_epoch" in state and int(state["num_tasks_per_epoch"]) != num_units:
        raise ValueError(
            f"loader state was saved for {state['num_tasks_per_epoch']} tasks per epoch, "
            f"this loader's split {split!r} has {num_units}"
        )
    epoch, consumed = int(state["epoch"]), int(state["tasks_consumed"])
    if epoch < 0 or not 0 <= consumed <= num_units:
        raise ValueError(
            f"loader state epoch={epoch}, tasks_consumed={consumed} is outside "
            f"epoch >= 0, 0..{num_units}"
        )
    return epoch, consumed
