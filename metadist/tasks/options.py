"""Option checks a task sampler's constructor needs, with messages that name the option.

Public for sampler authors: a sampler of your own validates its options the same way.

Example:
    >>> check_positive("my_sampler", lookback=lookback, num_shots=num_shots)
    >>> self.input_columns = resolve_columns(store, input_columns, "input_columns")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def check_positive(sampler: str, **values: Any) -> None:
    """Raises `ValueError` naming the first of `values` that is not an integer >= 1."""
    for field, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{sampler} sampler: {field} must be an integer >= 1, got {value!r}")


def resolve_columns(store: Any, names: Sequence[str] | str, field: str) -> list[int]:
    """Store column indices of `names` (one name or a list), in the given order.

    Raises:
        ValueError: an empty list or a name the store does not have, prefixed by `field`.
    """
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names:
        raise ValueError(f"{field} is empty; name at least one of {store.column_names}")
    try:
        return store.column_index(names)
    except ValueError as error:
        raise ValueError(f"{field}: {error}") from None
