"""Forecast tasks whose query truth comes from a separate holdout (the competition protocol).

See `metadist.eval.holdout` for reading the holdout file; this module turns the training
part of each entity and its holdout values into tasks: the support windows end where the
training part ends, the query input is its last L rows (`metadist.tasks.series_end`,
padding `"series"`), the query targets are the holdout.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from metadist.batch import MetaBatch, TaskSet
from metadist.tasks.series_end import SeriesEndWindows


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
    # a short series is front-filled with its first row; it gives fewer windows
    windows = SeriesEndWindows(lookback, horizon, num_support, stride, padding="series")
    targets = list(target_columns)
    groups: dict[tuple[int, int], list[int]] = {}
    for entity in np.asarray(entities, dtype=np.int64):
        entity = int(entity)
        if entity not in holdout:
            raise ValueError(
                f"entity {store.entity_ids[entity]!r} has no rows in the holdout; evaluate only "
                "entities that have one"
            )
        num_windows = windows.num_windows(int(store.lengths[entity]))
        groups.setdefault((num_windows, len(holdout[entity][0])), []).append(entity)
    scaler = store.scaler
    for _, members in sorted(groups.items()):
        for first in range(0, len(members), batch_size):
            chunk = np.asarray(members[first : first + batch_size], dtype=np.int64)
            support_x, support_y, query_x, query_y, split_time = [], [], [], [], []
            for entity in chunk:
                series = np.asarray(store.series(int(entity)))
                x, y, query = windows.cut(series, input_columns, targets)
                support_x.append(x)
                support_y.append(y)
                query_x.append(query)
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
