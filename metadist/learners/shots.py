"""Settings by shot count: the support examples per class an episode gives each way.

A classification learner sees K from its support labels alone (`support_shots`), so an
option can map K to a setting (`by_shots`), e.g. the eval-mode inner step size and step
count of `maml` (`eval_inner_lr_by_shots`, `eval_inner_steps_by_shots`): fitting 1
example per class is not fitting 5.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor


def support_shots(y: Tensor) -> int:
    """K: the fewest support examples of any class present in any task.

    Args:
        y: `[B, S]` integer class labels of B tasks' support sets (N-way K-shot: S = N·K).

    Returns:
        The smallest count of a label that occurs in a task (K for N-way K-shot episodes).
    """
    labels = y.long().reshape(y.shape[0], -1)
    counts = torch.nn.functional.one_hot(labels, int(labels.max()) + 1).sum(-2)  # [B, C]
    return int(counts[counts > 0].min())


def by_shots(value: Any, *, integer: bool = False) -> dict[int, Any]:
    """`{K: number}` from an option's value (None: empty); keys may be digit strings
    (a JSON or command-line mapping). With `integer`, every value must be an int (a step
    count) and is returned as one.

    Raises:
        ValueError: not a mapping, a key that is not an int >= 1, a value that is not a
            number > 0 (an int >= 1 with `integer`; the message is the requirement; the
            caller names the field).
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("must be a mapping {shots: value} or null")
    out: dict[int, Any] = {}
    for key, number in value.items():
        shots = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(shots, bool) or not isinstance(shots, int) or shots < 1:
            raise ValueError(f"keys must be shot counts, ints >= 1 (got key {key!r})")
        if integer:
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise ValueError(f"values must be ints >= 1 (got {number!r} for {key!r})")
            out[shots] = number
            continue
        if isinstance(number, bool) or not isinstance(number, int | float) or not number > 0:
            raise ValueError(f"values must be numbers > 0 (got {number!r} for {key!r})")
        out[shots] = float(number)
    return out
