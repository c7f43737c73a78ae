"""A user's history of new entities: read, checked, and scaled by the store's rule.

The history has the long format `metadist ingest` takes: one row per (entity, time), the
store's entity and time columns and its value columns. Each entity is checked (no
repeated time, the store's NaN rule) and scaled as ingest scales a store's entities:
with the store's global statistics, or (per-entity scaling) with its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metadist.api.protocols import StoreSchema
from metadist.store.order import fill_forward
from metadist.store.scaler import scale_of


class DataFrameLike(Protocol):
    """A pandas DataFrame (pandas is optional: what is read of it)."""

    columns: Any

    def to_dict(self, *args: Any, **kwargs: Any) -> Any: ...


# a history: a Parquet file or directory, a pyarrow Table, a pandas frame or a mapping of
# column name to values
History: TypeAlias = str | os.PathLike | pa.Table | DataFrameLike | dict[str, Any]


@dataclass
class Entity:
    """One entity of a history, its rows sorted by time."""

    key: str
    times: np.ndarray  # [m] int64
    values: np.ndarray  # [m, C] float64, original units, NaN rule applied
    stratum: str = ""  # from the store's stratum and label columns, where the history has them
    label: str = ""
    scaled: np.ndarray | None = None  # [m, C] float32
    mean: np.ndarray | None = None  # [C] per-entity statistics (per-entity scaling)
    std: np.ndarray | None = None


def read_history(history: History, store: StoreSchema) -> list[Entity]:
    """The entities of `history` (see `Run.forecast`), sorted by key.

    Raises:
        FileNotFoundError: a path with no Parquet file or directory.
        ValueError: an unreadable type, a missing column, no rows, a repeated time, or a
            non-finite value the store's NaN rule does not allow.
    """
    table = _table(history)
    meta = store.metadata
    entity_col, time_col = meta["entity_col"], meta["time_col"]
    value_names = list(store.column_names)
    missing = [c for c in (entity_col, time_col, *value_names) if c not in table.column_names]
    if missing:
        raise ValueError(
            f"history has no column {missing[0]!r}; the run's store needs {entity_col!r}, "
            f"{time_col!r} and {', '.join(map(repr, value_names))}"
        )
    if table.num_rows == 0:
        raise ValueError("history has no rows")
    keys = np.asarray(table.column(entity_col).to_pylist(), dtype=object).astype(str)
    times = _times(table.column(time_col), time_col)
    values = np.column_stack([_floats(table.column(name), name) for name in value_names]).astype(
        np.float64
    )
    nan_rule = str(meta.get("nan_policy", "error"))
    categories = {
        role: np.asarray(table.column(meta[f"{role}_col"]).to_pylist(), dtype=object).astype(str)
        for role in ("stratum", "label")
        if meta.get(f"{role}_col") and meta[f"{role}_col"] in table.column_names
    }
    entities = []
    order = np.lexsort((times, keys))
    keys, times, values = keys[order], times[order], values[order]
    categories = {role: codes[order] for role, codes in categories.items()}
    boundaries = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    for first, end in zip(
        np.concatenate(([0], boundaries)), np.concatenate((boundaries, [len(keys)])), strict=True
    ):
        key = str(keys[first])
        entity_times, entity_values = times[first:end], values[first:end].copy()
        repeated = np.flatnonzero(np.diff(entity_times) == 0)
        if repeated.size:
            raise ValueError(
                f"history: entity {key!r} has two rows at {time_col}={entity_times[repeated[0]]}"
            )
        entity_values, entity_times = _apply_nan_rule(
            key, entity_values, entity_times, value_names, nan_rule
        )
        entity = Entity(key, entity_times, entity_values)
        entity.stratum = str(categories["stratum"][first]) if "stratum" in categories else ""
        entity.label = str(categories["label"][first]) if "label" in categories else ""
        entities.append(entity)
    return entities


def _table(history: History) -> pa.Table:
    """`history` as a pyarrow Table (from a path, a Table, a pandas frame or a mapping)."""
    if isinstance(history, (str, os.PathLike)):
        path = Path(history)
        if not path.exists():
            raise FileNotFoundError(f"history: no Parquet file or directory at {path}")
        return pq.read_table(path)
    if isinstance(history, pa.Table):
        return history
    if hasattr(history, "to_dict") and hasattr(history, "columns"):  # pandas
        return pa.Table.from_pandas(history, preserve_index=False)
    if isinstance(history, dict):
        return pa.table(history)
    raise ValueError(
        f"history must be a pandas DataFrame, a pyarrow Table, a mapping of columns or a "
        f"Parquet path, got {type(history).__name__}"
    )


def _times(column: pa.ChunkedArray, name: str) -> np.ndarray:
    if column.null_count:
        raise ValueError(f"history: column {name!r} has null times")
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("ns")).cast(pa.int64())
    elif pa.types.is_date(column.type):
        column = pc.cast(column, pa.date32()).cast(pa.int64())
    elif not pa.types.is_integer(column.type):
        raise ValueError(
            f"history: column {name!r} must hold integers, dates or timestamps, got {column.type}"
        )
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def _floats(column: pa.ChunkedArray, name: str) -> np.ndarray:
    if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        raise ValueError(f"history: column {name!r} must hold numbers, got {column.type}")
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def _apply_nan_rule(
    key: str, values: np.ndarray, times: np.ndarray, names: list[str], rule: str
) -> tuple[np.ndarray, np.ndarray]:
    finite = np.isfinite(values)
    if finite.all():
        return values, times
    if rule == "drop":
        keep = finite.all(axis=1)
        return values[keep], times[keep]
    column = int(np.flatnonzero(~finite.all(axis=0))[0])
    if rule != "ffill":
        row = int(np.flatnonzero(~finite[:, column])[0])
        raise ValueError(
            f"history: entity {key!r} has {values[row, column]} in column {names[column]!r} at "
            f"time {times[row]}; the run's store was built with --nan {rule}, so the history "
            "must be finite"
        )
    if not finite.any(axis=0).all():
        empty = names[int(np.flatnonzero(~finite.any(axis=0))[0])]
        raise ValueError(f"history: entity {key!r} has no finite value in column {empty!r}")
    filled = values.copy()
    fill_forward(filled, np.zeros(1, np.int64), np.array([len(filled)], np.int64))
    return filled, times


def scale_entity(store: StoreSchema, entity: Entity) -> Entity:
    """`entity` with its values in the store's scaled units (float32, as stored)."""
    scaler = store.scaler
    values = entity.values
    if scaler.kind == "none":
        entity.scaled = values.astype(np.float32)
        return entity
    if scaler.kind == "global":
        mean, std = scaler.mean, scaler.std
    else:  # per-entity: the entity's own statistics, as ingest computes them
        finite = np.isfinite(values)
        count = finite.sum(axis=0).astype(np.float64)
        mean = np.where(finite, values, 0.0).sum(axis=0) / np.maximum(count, 1)
        m2 = (np.where(finite, values - mean, 0.0) ** 2).sum(axis=0)
        std = scale_of(count, m2)
    entity.mean, entity.std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    entity.scaled = ((values - entity.mean) / entity.std).astype(np.float32)
    return entity


def unscale(
    store: StoreSchema, entity: Entity, values: np.ndarray, columns: list[int]
) -> np.ndarray:
    """`values [..., len(columns)]` of `entity`'s store `columns` back in original units."""
    if store.scaler.kind == "none":
        return values
    assert entity.mean is not None and entity.std is not None
    return values * entity.std[columns] + entity.mean[columns]
