"""A sampler's units as the partitioner and the loader read them, checked.

`num_units` and `unit_strata()` are the two things every sampler of one's own must get
right before any task is drawn; `unit_entities()` is what entity and class splits read,
and `unit_rows()` what the loader's blocked order and read-ahead read. Read here, a float
count, or strata, entities or rows of the wrong length or type, is one `ValueError` naming
the sampler and the method, instead of a numpy traceback or a message that blames the
split's settings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from metadist.tasks.base import TaskSampler
from metadist.tasks.naming import sampler_label


def checked_num_units(sampler: TaskSampler) -> int:
    """`sampler.num_units` as an `int`.

    Raises:
        ValueError: it is not a whole number >= 0 (a float, a bool, negative).
    """
    value = sampler.num_units
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(
            f"{sampler_label(sampler)}: num_units is {value!r} ({type(value).__name__}); it must "
            "be a whole number >= 0 (an int)"
        )
    return int(value)


def checked_unit_strata(sampler: TaskSampler) -> np.ndarray:
    """`[num_units]` int64: `sampler.unit_strata()`, checked against `num_units`.

    Raises:
        ValueError: `num_units` is not a whole number, or `unit_strata()` is not a 1-d
            array of `num_units` integer codes.
    """
    num_units = checked_num_units(sampler)
    strata = np.asarray(sampler.unit_strata())
    if strata.ndim != 1 or (len(strata) and not np.issubdtype(strata.dtype, np.integer)):
        raise ValueError(
            f"{sampler_label(sampler)}: unit_strata() returned shape {strata.shape} dtype "
            f"{strata.dtype}; it must be [num_units] integer stratum codes"
        )
    if len(strata) != num_units:
        raise ValueError(
            f"{sampler_label(sampler)}: unit_strata() returned {len(strata)} codes for its "
            f"{num_units} units (num_units); it must give one per unit"
        )
    return strata.astype(np.int64)


def checked_unit_rows(sampler: TaskSampler, rows: Any) -> tuple[np.ndarray, np.ndarray]:
    """`rows`, what `sampler.unit_rows()` returned, as two `[num_units]` int64 arrays.

    Raises:
        ValueError: not a pair of `num_units` non-negative integers each.
    """
    num_units = checked_num_units(sampler)
    what = f"{sampler_label(sampler)}: unit_rows() must be (first_row, num_rows), two [num_units]"
    try:
        first, count = (np.asarray(part) for part in rows)
    except (TypeError, ValueError):
        raise ValueError(f"{what} integer arrays; got {type(rows).__name__}") from None
    for name, part in (("first_row", first), ("num_rows", count)):
        if part.shape != (num_units,) or not np.issubdtype(part.dtype, np.integer):
            raise ValueError(
                f"{what} integer arrays; its {name} has shape {part.shape} dtype {part.dtype} "
                f"for {num_units} units"
            )
        if len(part) and int(part.min()) < 0:
            raise ValueError(f"{what} non-negative integer arrays; its {name} has {part.min()}")
    return first.astype(np.int64), count.astype(np.int64)


def checked_unit_entities(sampler: TaskSampler, store: Any = None) -> np.ndarray | None:
    """`sampler.unit_entities()` as `[num_units]` int64 store entities, or None where its
    units are not store entities.

    Raises:
        ValueError: not one integer per unit, or (given the `store`) an entity the store
            does not have.
    """
    entities = sampler.unit_entities()
    if entities is None:
        return None
    num_units = checked_num_units(sampler)
    given = np.asarray(entities)
    if given.shape != (num_units,) or (num_units and not np.issubdtype(given.dtype, np.integer)):
        raise ValueError(
            f"{sampler_label(sampler)}: unit_entities() returned shape {given.shape} dtype "
            f"{given.dtype} for its {num_units} units; it must be one store entity index per "
            "unit (or None)"
        )
    num_entities = getattr(store, "num_entities", None)
    if num_units and num_entities is not None:
        outside = given[(given < 0) | (given >= num_entities)]
        if len(outside):
            raise ValueError(
                f"{sampler_label(sampler)}: unit_entities() has {outside[:3].tolist()}, outside the "
                f"store's entities 0..{num_entities - 1}"
            )
    return given.astype(np.int64)
