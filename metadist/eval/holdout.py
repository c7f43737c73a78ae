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

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from metadist.batch import MetaBatch, TaskSet


def read_holdout(
    path: str | Path, store: Any, *, entity_col: str, time_col: str, value_cols: Sequence[str]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The holdout rows of every store entity.

    Returns:
        `{entity index: (times [h] int64, values [h, T] float64)}`, time-sorted.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: missing columns, entities the store does not know, an entity whose
            holdout does not start after its training part, or NaN values.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"eval.holdout.path: no holdout file at {path}")
    columns = [entity_col, time_col, *value_cols]
    schema = pq.read_schema(path)
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ValueError(
            f"holdout {path} has no column {missing[0]!r}; its columns: {', '.join(schema.names)}"
        )
    table = pq.read_table(path, columns=columns)
    if table.num_rows == 0:
        raise ValueError(f"holdout {path} has no rows")
    ids = np.asarray(table.column(entity_col).to_pylist(), dtype=object).astype(str)
    times = np.asarray(pc.cast(table.column(time_col), "int64").to_numpy(), dtype=np.int64)
    values = np.stack(
        [np.asarray(table.column(c).to_numpy(), dtype=np.float64) for c in value_cols], axis=1
    )
    if np.isnan(values).any():
        raise ValueError(f"holdout {path} has NaN values in {', '.join(value_cols)}")
    store_index = {str(name): i for i, name in enumerate(store.entity_ids)}
    unknown = sorted(set(ids.tolist()) - set(store_index))
    if unknown:
        raise ValueError(
            f"holdout {path} has {len(unknown)} entities the store {store.path} does not hold, "
            f"e.g. {unknown[0]!r}"
        )
    order = np.lexsort((times, ids))
    ids, times, values = ids[order], times[order], values[order]
    boundaries = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for block in np.split(np.arange(len(ids)), boundaries):
        entity = store_index[ids[block[0]]]
        last_train_time = int(store.series_times(entity)[-1])
        if times[block[0]] <= last_train_time:
            raise ValueError(
                f"holdout {path}: entity {ids[block[0]]!r} starts at time {times[block[0]]}, not "
                f"after its training part (last time {last_train_time}): the holdout would "
                "overlap the data used for adaptation"
            )
        out[entity] = (times[block], values[block])
    return out


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


def holdout_batches(
    store: Any,
    holdout: dict[int, tuple[np.ndarray, np.ndarray]],
    *,
    entities: np.ndarray,
    lookback: int,
    horizon: int,
    num_support: int,
    stride: int,
    input_columns: Sequence[int],
    target_columns: Sequence[int],
    batch_size: int,
) -> Iterator[MetaBatch]:
    """Batches of holdout tasks for `entities` (see the module docstring).

    Yields:
        `MetaBatch` with `support.x [B, K, L, F]`, `support.y [B, K, H, T]`,
        `query.x [B, 1, L, F]`, `query.y [B, 1, h, T]` (h: the batch's holdout length),
        `split_time` the first holdout time of each task.

    Raises:
        ValueError: an entity without holdout rows.
    """
    window = lookback + horizon
    inputs = list(input_columns)
    targets = list(target_columns)
    groups: dict[tuple[int, int], list[int]] = {}
    for entity in np.asarray(entities, dtype=np.int64):
        entity = int(entity)
        if entity not in holdout:
            raise ValueError(
                f"entity {store.entity_ids[entity]!r} has no rows in the holdout; evaluate only "
                "entities that have one"
            )
        length = max(int(store.lengths[entity]), window)
        num_windows = min(num_support, (length - window) // stride + 1)
        groups.setdefault((num_windows, len(holdout[entity][0])), []).append(entity)
    scaler = store.scaler
    for (num_windows, _), members in sorted(groups.items()):
        for first in range(0, len(members), batch_size):
            chunk = np.asarray(members[first : first + batch_size], dtype=np.int64)
            support_x, support_y, query_x, query_y, split_time = [], [], [], [], []
            for entity in chunk:
                series = np.asarray(store.series(int(entity)))
                if series.shape[0] < window:
                    pad = np.repeat(series[:1], window - series.shape[0], axis=0)
                    series = np.concatenate([pad, series])
                length = series.shape[0]
                starts = length - window - stride * np.arange(num_windows)[::-1]
                rows = starts[:, None] + np.arange(window)[None, :]  # [K, L + H]
                support_x.append(series[rows[:, :lookback]][:, :, inputs])
                support_y.append(series[rows[:, lookback:]][:, :, targets])
                query_x.append(series[length - lookback :, inputs][None])
                times, values = holdout[int(entity)]
                truth = scaler.transform(values, int(entity), targets)
                query_y.append(truth[None])
                split_time.append(times[0])
            yield MetaBatch(
                support=TaskSet(_tensor(support_x), _tensor(support_y)),
                query=TaskSet(_tensor(query_x), _tensor(query_y)),
                entity_index=torch.from_numpy(chunk),
                stratum=torch.from_numpy(np.asarray(store.stratum_codes, np.int64)[chunk]),
                split_time=torch.tensor(split_time, dtype=torch.int64),
            )


def _tensor(parts: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.stack(parts), dtype=np.float32))
