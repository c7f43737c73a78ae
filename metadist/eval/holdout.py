"""Tasks whose query truth is a separate holdout file (the forecasting-competition protocol).

The store holds only each series' training part; the holdout (e.g. M3's `test.parquet`)
holds the next h values of each series, h possibly differing between series. Each entity
becomes one task:

- support: the K most recent windows (lookback L, model horizon H, stride s) that fit in
  the training part, the newest ending at its last row (fewer than K for a short series;
  a series shorter than one window, L + H rows, is padded at the front with its first
  value to exactly one window);
- query: input = the last L rows of the training part, target = the entity's holdout
  values (scaled like the store, so the scoring code inverts them like any query).

Tasks are batched by (number of support windows, holdout horizon), so every batch has one
shape. Nothing from the holdout reaches the support set or the query inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from metadist.tasks.holdout import holdout_batches

__all__ = ["HoldoutReader", "covered_entities", "holdout_batches", "read_holdout"]


def read_holdout(
    path: str | Path, store: Any, *, entity_col: str, time_col: str, value_cols: Sequence[str]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The holdout rows of every store entity.

    Returns:
        `{entity index: (times [h] int64, values [h, T] float64)}`, time-sorted.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: a file that is not Parquet, missing columns, a null, times or values
            of another type, entities the store does not know, an entity whose holdout
            does not start after its training part or has two rows at one time, or values
            that are not finite (NaN, inf).
    """
    from metadist.store.sources import open_parquet, to_int64_time

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"eval.holdout.path: no holdout file at {path}")
    columns = list(dict.fromkeys([entity_col, time_col, *value_cols]))
    parquet = open_parquet(path)  # a file that is not Parquet: named
    schema = parquet.schema_arrow
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ValueError(
            f"holdout {path} has no column {missing[0]!r}; its columns: {', '.join(schema.names)}"
        )
    table = parquet.read(columns=columns)
    if table.num_rows == 0:
        raise ValueError(f"holdout {path} has no rows")
    _check_columns(path, table, time_col, value_cols)
    ids = np.asarray(table.column(entity_col).to_pylist(), dtype=object).astype(str)
    # as the store keeps them: timestamps and dates as epoch nanoseconds, whatever unit
    # the file has (pandas writes microseconds), integers as given
    times = to_int64_time(table.column(time_col).combine_chunks(), path, 0, time_col)
    values = np.stack(
        [np.asarray(table.column(c).to_numpy(), dtype=np.float64) for c in value_cols], axis=1
    )
    bad = np.flatnonzero(~np.isfinite(values).all(axis=1))
    if len(bad):
        # an infinite truth would make the task's sMAPE and MAPE NaN: left out unsaid
        raise ValueError(
            f"holdout {path}: row {int(bad[0])} has a value that is not finite "
            f"({values[bad[0]].tolist()} in {', '.join(value_cols)}; {len(bad)} such rows)"
        )
    store_index = {str(name): i for i, name in enumerate(store.entity_ids)}
    unknown = sorted(set(ids.tolist()) - set(store_index))
    if unknown:
        raise ValueError(
            f"holdout {path} has {len(unknown)} entities the store {store.path} does not hold, "
            f"e.g. {unknown[0]!r}"
        )
    order = np.lexsort((times, ids))
    ids, times, values = ids[order], times[order], values[order]
    repeated = np.flatnonzero((ids[1:] == ids[:-1]) & (times[1:] == times[:-1]))
    if len(repeated):
        # two truths of one step would score that step twice, the horizon one step longer
        raise ValueError(
            f"holdout {path}: entity {str(ids[repeated[0]])!r} has more than one row at "
            f"{time_col} {int(times[repeated[0]])} ({len(repeated)} such repeated rows)"
        )
    boundaries = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for block in np.split(np.arange(len(ids)), boundaries):
        entity = store_index[ids[block[0]]]
        last_train_time = int(store.series_times(entity)[-1])
        if times[block[0]] <= last_train_time:
            raise ValueError(
                f"holdout {path}: entity {str(ids[block[0]])!r} starts at time {times[block[0]]}, not "
                f"after its training part (last time {last_train_time}): the holdout would "
                "overlap the data used for adaptation"
            )
        out[entity] = (times[block], values[block])
    return out


def _check_columns(path: Path, table: Any, time_col: str, value_cols: Sequence[str]) -> None:
    """Refuses a null in any column read (a null id became the entity `'None'`, a null
    time a time of NaN), times that are not integers, timestamps or dates, and values
    that are not numbers.

    Raises:
        ValueError: naming the file, the column and the first null's row.
    """
    import pyarrow as pa

    from metadist.store.sources import first_null

    for name in table.column_names:
        row = first_null(table.column(name).combine_chunks())
        if row is not None:
            raise ValueError(f"holdout {path}: row {row}: column {name!r} is null")
    kinds = {time_col: "time steps (integers, timestamps or dates)"}
    kinds.update(dict.fromkeys(value_cols, "numbers"))
    for name, kind in kinds.items():
        dtype = table.schema.field(name).type
        if pa.types.is_dictionary(dtype):
            dtype = dtype.value_type
        integer = pa.types.is_integer(dtype)
        if name == time_col:
            fits = integer or pa.types.is_timestamp(dtype) or pa.types.is_date(dtype)
        else:
            fits = integer or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype)
        if not fits:
            raise ValueError(f"holdout {path}: column {name!r} must hold {kind}, not {dtype}")


def covered_entities(
    path: str | Path, store: Any, holdout: dict, entities: np.ndarray, *, partial: bool
) -> tuple[np.ndarray, int]:
    """The entities of `entities` that have holdout rows, and how many were left out.

    A holdout that lacks some evaluated entities would score only part of the split
    without saying so: it is refused unless `partial` (`eval.holdout.partial=true`).

    Raises:
        ValueError: entities without holdout rows and not `partial`, naming how many and
            one of them.
    """
    entities = np.asarray(entities, dtype=np.int64)
    has = np.isin(entities, np.fromiter(holdout, np.int64, len(holdout)))
    num_left_out = int((~has).sum())
    if num_left_out and not partial:
        example = store.entity_ids[int(entities[~has][0])]
        raise ValueError(
            f"holdout {path} has no rows for {num_left_out} of the {len(entities)} entities "
            f"evaluated (e.g. {str(example)!r}); give every entity a holdout, or set "
            "eval.holdout.partial=true to score only those it has"
        )
    return entities[has], num_left_out


@dataclass(frozen=True)
class HoldoutReader:
    """What `eval.holdout` names, handed to a forecasting sampler's `for_evaluation`.

    `read(target_names)` reads the file's values for the sampler's target columns (or
    `value_cols` when given); `cover(holdout, entities)` keeps the entities it has rows
    for, refusing a partial holdout unless `partial` (see `covered_entities`).
    """

    path: str
    store: Any
    entity_col: str
    time_col: str
    value_cols: Sequence[str] | None = None
    partial: bool = False

    def read(self, target_names: Sequence[str]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        return read_holdout(
            self.path,
            self.store,
            entity_col=self.entity_col,
            time_col=self.time_col,
            value_cols=list(self.value_cols or target_names),
        )

    def cover(self, holdout: dict, entities: np.ndarray) -> tuple[np.ndarray, int]:
        return covered_entities(self.path, self.store, holdout, entities, partial=self.partial)
