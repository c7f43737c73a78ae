"""A user's history of new entities: read, checked, and scaled by the store's rule.

The history has the long format `metadist ingest` takes: one row per (entity, time), the
store's entity and time columns and its value columns. Each entity is checked (no
repeated time, the store's NaN rule) and scaled as ingest scales a store's entities:
with the store's global statistics, or (per-entity scaling) with its own.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import numpy as np
import pyarrow as pa

from metadist.api.history_files import read_history_files
from metadist.api.protocols import StoreSchema
from metadist.api.times import Step, regular_step, shown_time, time_numbers
from metadist.progress import Progress
from metadist.store.order import fill_forward
from metadist.store.scaler import scale_of
from metadist.store.scan import _too_large  # ingest's limits, in one place


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

    key: str  # the entity's id as text, for messages
    times: np.ndarray  # [m] int64
    values: np.ndarray  # [m, C] float64, original units, NaN rule applied
    stratum: str = ""  # from the store's stratum and label columns, where the history has them
    label: str = ""
    scaled: np.ndarray | None = None  # [m, C] float32
    mean: np.ndarray | None = None  # [C] per-entity statistics (per-entity scaling)
    std: np.ndarray | None = None
    step: Step | None = None  # the spacing of its times (`metadist.api.times`)
    time_type: pa.DataType | None = None  # the history's time column type
    id: Any = None  # the entity's id as the history holds it (None: `key`)
    id_type: pa.DataType | None = None  # the history's entity column type
    source: str = ""  # an example's argument (`support_x[2]`); "": a history's entity

    def cell(self, row: int, column: int, names: list[str]) -> str:
        """`<it> has <value> in column <name> at <when>`, for messages: a history's
        entity by its id and time, an example by its argument and row."""
        who = self.source or f"history: entity {self.key!r}"
        when = (
            f"row {row}" if self.source else f"time {shown_time(self.times[row], self.time_type)}"
        )
        return (
            f"{who} has {float(self.values[row, column])!r} in column {names[column]!r} at {when}"
        )


def _check_columns(table: pa.Table, entity_col: str, time_col: str, value_names: list[str]) -> None:
    """Raises a `ValueError` where `table` lacks a column the run's store needs, has no
    rows, or a null id or time."""
    missing = [c for c in (entity_col, time_col, *value_names) if c not in table.column_names]
    if missing:
        raise ValueError(
            f"history has no column {missing[0]!r}; the run's store needs {entity_col!r}, "
            f"{time_col!r} and {', '.join(map(repr, value_names))}"
        )
    if table.num_rows == 0:
        raise ValueError("history has no rows")
    for name in (entity_col, time_col):
        _check_no_null(table.column(name), name)


def read_history(
    history: History, store: StoreSchema, display: Progress | None = None
) -> list[Entity]:
    """The entities of `history` (see `Run.forecast`), sorted by key, each counted on
    `display` (where given) as it is read.

    A note on stderr says how many non-finite values the store's NaN rule filled or
    dropped, if any.

    Raises:
        FileNotFoundError: a path with no Parquet file, directory or match of a pattern
            (read as ingest reads its input: `history_files`).
        ValueError: an unreadable type, a missing column, no rows, a repeated time, a gap
            or irregular steps in an entity's times (`metadist.api.times`), a non-finite
            value the store's NaN rule does not allow, an entity the `drop` rule leaves
            with fewer than two rows or whose last rows it drops, or a value the store's
            scaling cannot hold.
    """
    table = _table(history)
    meta = store.metadata
    entity_col, time_col = meta["entity_col"], meta["time_col"]
    value_names = list(store.column_names)
    _check_columns(table, entity_col, time_col, value_names)
    ids = np.asarray(table.column(entity_col).to_pylist(), dtype=object)
    keys = ids.astype(str)
    time_type = table.schema.field(time_col).type
    times = time_numbers(table.column(time_col), time_col, table.column(entity_col))
    values = np.column_stack([_floats(table.column(name), name) for name in value_names]).astype(
        np.float64
    )
    rule = NanRule.of_store(store)
    scaling = str(meta["scaling"]["kind"])
    categories = {
        role: np.asarray(table.column(meta[f"{role}_col"]).to_pylist(), dtype=object).astype(str)
        for role in ("stratum", "label")
        if meta.get(f"{role}_col") and meta[f"{role}_col"] in table.column_names
    }
    entities = []
    order = np.lexsort((times, keys))
    ids, keys, times, values = ids[order], keys[order], times[order], values[order]
    categories = {role: codes[order] for role, codes in categories.items()}
    id_type = table.schema.field(entity_col).type
    boundaries = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    read = (
        None
        if display is None
        else display.counter("forecast: history read", len(boundaries) + 1, "entities")
    )
    for first, end in zip(
        np.concatenate(([0], boundaries)), np.concatenate((boundaries, [len(keys)])), strict=True
    ):
        key = str(keys[first])
        entity_times, entity_values = times[first:end], values[first:end].copy()
        repeated = np.flatnonzero(np.diff(entity_times) == 0)
        if repeated.size:
            when = shown_time(entity_times[repeated[0]], time_type)
            raise ValueError(f"history: entity {key!r} has two rows at {time_col}={when}")
        fill = " (or rows of NaN, which the store's --nan ffill rule fills)"
        step = regular_step(key, entity_times, time_type, fill if rule.name == "ffill" else "")
        if step is None:
            raise ValueError(
                f"history: entity {key!r} has one row ({time_col}="
                f"{shown_time(entity_times[0], time_type)}): its time step, and so the times "
                "of its forecasts, cannot be known; give it at least two rows"
            )
        given = len(entity_times)
        entity = rule.apply(
            Entity(key, entity_times, entity_values, step=step, time_type=time_type)
        )
        _check_rows_left(key, entity.times, times[end - 1], given, time_col, time_type)
        check_magnitude(entity, value_names, scaling)
        entity.id, entity.id_type = ids[first], id_type
        entity.stratum = str(categories["stratum"][first]) if "stratum" in categories else ""
        entity.label = str(categories["label"][first]) if "label" in categories else ""
        entities.append(entity)
        if read is not None:
            read.advance(1)
    rule.note()
    return entities


def _check_rows_left(
    key: str,
    kept: np.ndarray,
    last: int,
    given: int,
    time_col: str,
    time_type: pa.DataType,
) -> None:
    """Refuses an entity the store's NaN rule (`drop`) leaves with fewer than two rows,
    or whose last rows it drops: its forecasts continue its last row kept, so they would
    be given times inside its history. Rows dropped inside the history stay dropped, as
    ingest drops them from the store training read.

    Args:
        kept: `[k]` times of the entity's rows the rule kept.
        last: the last time of its history as given.
        given: how many rows it was given.
    """
    dropped = f"once the store's --nan drop rule removes its {given - len(kept)} non-finite rows"
    if len(kept) == 0:
        raise ValueError(f"history: entity {key!r} has no row left {dropped}")
    if len(kept) == 1:
        raise ValueError(
            f"history: entity {key!r} has one row ({time_col}={shown_time(kept[0], time_type)}) "
            f"{dropped}: its time step, and so the times of its forecasts, cannot be known; "
            "give it at least two rows of finite values"
        )
    if kept[-1] != last:
        raise ValueError(
            f"history: entity {key!r} ends in rows the store's --nan drop rule removes (after "
            f"{time_col}={shown_time(kept[-1], time_type)}, up to {shown_time(last, time_type)}): "
            "its forecasts would start inside its history; give the history up to its last "
            "value"
        )


def _table(history: History) -> pa.Table:
    """`history` as a pyarrow Table (from a path, a Table, a pandas frame or a mapping)."""
    if isinstance(history, (str, os.PathLike)):
        return read_history_files(history)
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


def _check_no_null(column: pa.ChunkedArray, name: str) -> None:
    """Raises `ValueError` naming the first null row of an id or time column (as
    `metadist ingest` does): its row would otherwise form an entity of its own, "None"."""
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"history: row {row}: column {name!r} is null")


def _floats(column: pa.ChunkedArray, name: str) -> np.ndarray:
    if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        raise ValueError(f"history: column {name!r} must hold numbers, got {column.type}")
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


class NanRule:
    """The store's NaN rule (`metadist ingest --nan`) applied to a history's entities (or
    to the examples `Run.classify` takes) as ingest applies it to a store: `error` refuses
    a NaN, inf or null, `ffill` carries the last finite value forward (values before the
    first finite one take that one), `drop` removes the row. It counts what it changed,
    for one note.

    Args:
        name: the store's rule (`error`, `ffill` or `drop`).
        names: the store's value columns, for messages.
        given: what the entities are, for messages ("history", "examples").
    """

    def __init__(self, name: str, names: list[str], given: str = "history") -> None:
        self.name, self.names, self.given = name, names, given
        self.changed = 0  # cells filled or rows dropped
        self.first = ""  # where the first one was

    @classmethod
    def of_store(cls, store: StoreSchema, given: str = "history") -> NanRule:
        """The rule `store` was built with (`error` where its metadata names none)."""
        return cls(str(store.metadata.get("nan_policy", "error")), list(store.column_names), given)

    def apply(self, entity: Entity) -> Entity:
        """`entity` with the rule applied to its values (and, `drop`, its times).

        Raises:
            ValueError: a non-finite value under `error`, or a column without a finite
                value under `ffill`, named by the entity (or example), column and time
                (or row).
        """
        values = entity.values
        finite = np.isfinite(values)
        if finite.all():
            return entity
        column = int(np.flatnonzero(~finite.all(axis=0))[0])
        row = int(np.flatnonzero(~finite[:, column])[0])
        where = entity.cell(row, column, self.names)
        if self.name not in ("ffill", "drop"):
            raise ValueError(
                f"{where}; the run's store was built with --nan {self.name}, so the "
                f"{self.given} must be finite"
            )
        if not self.first:
            self.first = where.removeprefix("history: ")
        if self.name == "drop":
            keep = finite.all(axis=1)
            self.changed += int((~keep).sum())
            entity.values, entity.times = values[keep], entity.times[keep]
            return entity
        if not finite.any(axis=0).all():
            empty = self.names[int(np.flatnonzero(~finite.any(axis=0))[0])]
            who = entity.source or f"history: entity {entity.key!r}"
            raise ValueError(f"{who} has no finite value in column {empty!r}")
        self.changed += int((~finite).sum())
        filled = values.copy()
        fill_forward(filled, np.zeros(1, np.int64), np.array([len(filled)], np.int64))
        entity.values = filled
        return entity

    def note(self) -> None:
        """One line on stderr saying what the rule changed, if anything."""
        if not self.changed:
            return
        what = "values filled" if self.name == "ffill" else "rows dropped"
        print(
            f"note: {self.given}: {self.changed} non-finite {what} by the store's --nan "
            f"{self.name} rule (the first: {self.first})",
            file=sys.stderr,
        )


def check_magnitude(entity: Entity, names: list[str], scaling: str) -> None:
    """Refuses a value of `entity` beyond what the store's scaling holds (columns
    `names`), as ingest refuses it."""
    found = _too_large(list(entity.values.T), scaling)
    if found is None:
        return
    column, row, limit, _ = found
    raise ValueError(
        f"{entity.cell(row, column, names)}, beyond {limit:.4g}: the store's {scaling} "
        "scaling cannot hold it (ingest refuses such values too)"
    )


def scale_entity(store: StoreSchema, entity: Entity) -> Entity:
    """`entity` with its values in the store's scaled units (float32, as stored)."""
    scaler = store.scaler
    values = entity.values
    if scaler.kind == "none":
        entity.scaled = _float32(entity, values, scaler.kind, store.column_names)
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
    entity.scaled = _float32(
        entity, (values - entity.mean) / entity.std, scaler.kind, store.column_names
    )
    return entity


def _float32(entity: Entity, scaled: np.ndarray, kind: str, names: list[str]) -> np.ndarray:
    """`scaled` as float32, refusing a value float32 cannot hold (it would be inf)."""
    with np.errstate(over="ignore"):
        out = scaled.astype(np.float32)
    beyond = np.isfinite(scaled) & ~np.isfinite(out)
    if beyond.any():
        row, column = (int(i[0]) for i in np.nonzero(beyond))
        raise ValueError(
            f"{entity.cell(row, column, names)}, which the store's {kind} scaling puts beyond "
            f"float32 ({scaled[row, column]:.4g})"
        )
    return out


def unscale(
    store: StoreSchema, entity: Entity, values: np.ndarray, columns: list[int]
) -> np.ndarray:
    """`values [..., len(columns)]` of `entity`'s store `columns` back in original units."""
    if store.scaler.kind == "none":
        return values
    assert entity.mean is not None and entity.std is not None
    return values * entity.std[columns] + entity.mean[columns]
