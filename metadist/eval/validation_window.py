"""The validation window of a forecast task: the last H points of the history it sees.

To learn how to combine forecasts (`metadist.eval.learned_combination`), every method
forecasts, for each evaluated task, the last H points of the task's own history from
the points before them, exactly as it forecasts the evaluated horizon from the whole
history. Nothing of the evaluated horizon is read: the window and everything before it
lie before the task's split time.

`validation_histories` cuts the histories (original units) for the statistical methods;
`model_validation_batch` cuts the meta-trained model's tasks from the store's scaled
rows with the run's own windows (`metadist.tasks.inference.ForecastWindows`: K support
windows ending where the shortened history ends, the query window its last H points).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from metadist.batch import MetaBatch, TaskSet
from metadist.tasks.inference import ForecastWindows

# Fewest points a shortened history keeps for its series to have a validation window.
MIN_POINTS = 3


def validation_histories(
    histories: Sequence[np.ndarray], horizon: int
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Each history `[t, T]` cut before its last `horizon` points.

    Returns:
        `(shortened, truth [N, H, T], usable [N])`: the histories without their window
        (every history, cut or not, so that each has one), the windows' values (NaN where
        not usable) and which histories are long enough (at least `MIN_POINTS` points
        before the window).
    """
    shortened, truth, usable = [], [], []
    width = histories[0].shape[1] if histories else 1
    for history in histories:
        ok = len(history) >= horizon + MIN_POINTS
        usable.append(ok)
        shortened.append(history[:-horizon] if ok else history)
        truth.append(history[-horizon:] if ok else np.full((horizon, width), np.nan))
    out = np.stack(truth) if truth else np.zeros((0, horizon, width))
    return shortened, out, np.asarray(usable, dtype=bool)


def model_validation_batch(
    store: object,
    windows: ForecastWindows,
    entities: Sequence[int],
    num_history: Sequence[int],
    horizon: int,
) -> tuple[MetaBatch | None, np.ndarray]:
    """The model's validation tasks of the entities whose histories are long enough.

    Args:
        store: the `SeriesStore` (its scaled rows are cut).
        windows: the run's windows (lookback, model horizon, support, stride, padding,
            columns).
        entities: `[N]` store row of each task's entity.
        num_history: `[N]` rows of each entity before its task's split time.
        horizon: H, the evaluated horizon (the window's length).

    Returns:
        `(batch, rows)`: the tasks (support: the K windows ending `horizon` rows before
        the split; query: the window of the last `horizon` rows of the history) of the
        entities at `rows` (`[N]` bool), or `(None, rows)` where there is none.
    """
    ends = windows.end_windows
    parts: list[tuple[Any, ...]] = []
    rows = np.zeros(len(entities), dtype=bool)
    for i, (entity, count) in enumerate(zip(entities, num_history, strict=True)):
        series = np.asarray(store.series(int(entity))[: int(count)])  # type: ignore[attr-defined]
        cut = len(series) - horizon
        if cut < max(MIN_POINTS, ends.rows_needed):
            continue
        support_x, support_y, query_x = ends.cut(
            series[:cut], windows.input_columns, windows.target_columns
        )
        query_y = series[cut:, list(windows.target_columns)][None]
        parts.append((support_x, support_y, query_x, query_y, np.int64(entity)))
        rows[i] = True
    if not parts:
        return None, rows

    def stacked(k: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(np.stack([p[k] for p in parts])))

    num = len(parts)
    batch = MetaBatch(
        support=TaskSet(stacked(0), stacked(1)),
        query=TaskSet(stacked(2), stacked(3)),
        entity_index=stacked(4),
        stratum=torch.zeros(num, dtype=torch.int64),
        split_time=torch.full((num,), -1, dtype=torch.int64),
    )
    return batch, rows
