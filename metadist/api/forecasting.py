"""Forecasting new entities with a trained run (what `Run.forecast` does).

Each entity, scaled by the store's rule (`metadist.api.history`), becomes the task
evaluation would cut from it with `split="end"`: support windows ending where its history
ends, the query input its last L rows (`metadist.tasks.series_end`). The learner adapts
on the support windows and forecasts the next steps, which go back to the entity's
original units; the baselines forecast from the history in original units. A run that
records a plausibility band (`guard.json`, chosen on validation by `metadist
competition`) has its model's forecasts clipped to each entity's band
(`metadist.eval.plausibility`), as the competition scored it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from metadist.api.history import Entity, History, read_history, scale_entity, unscale
from metadist.api.protocols import AdaptingLearner, StoreSchema
from metadist.api.times import next_times, time_column
from metadist.batch import MetaBatch, TaskSet
from metadist.eval import baselines
from metadist.eval.plausibility import guard
from metadist.eval.scoring import _forecast
from metadist.eval.settings import EvalOptions
from metadist.learners.base import Params
from metadist.tasks.inference import ForecastWindows, forecast_windows

MODEL_METHODS = ("adapted", "unadapted")
BASELINE_METHODS = ("naive", "seasonal_naive", "theta")
MAX_ROLLS = 100  # a horizon beyond H feeds forecasts back, at most this many times H


def forecast(
    learner: AdaptingLearner,
    sampler: Any,
    store: StoreSchema,
    options: EvalOptions,
    history: History,
    *,
    horizon: int | None,
    methods: Sequence[str],
    period: int | None,
    steps: int | None,
    guard_width: float | None = None,
) -> pa.Table:
    """`Run.forecast` of a forecasting run's parts (see there for the arguments);
    `guard_width`: the run's recorded band width (None: no guard), which clips the
    model's forecasts (`adapted`, `unadapted` and combinations with them).

    Raises:
        ValueError: a sampler without the forecasting protocol
            (`metadist.tasks.inference`), and what `Run.forecast` lists.
    """
    windows = forecast_windows(sampler, len(store.column_names))
    wanted = check_methods(methods)
    horizon = check_horizon(windows, horizon, bool(wanted & set(MODEL_METHODS)))
    entities = [scale_entity(store, entity) for entity in read_history(history, store)]
    batch = forecast_batch(windows, entities, horizon)
    target_columns = list(windows.target_columns)
    forecasts: dict[str, np.ndarray] = {}
    model_methods = [m for m in MODEL_METHODS if m in wanted]
    if model_methods:
        if steps is None:
            steps = options.inner_steps
        scaled = model_forecasts(learner, batch, model_methods, steps)
        for method, values in scaled.items():
            forecasts[method] = np.stack(
                [
                    unscale(store, entity, values[b], target_columns)
                    for b, entity in enumerate(entities)
                ]
            )
            if guard_width is not None:
                forecasts[method] = guarded(
                    options, entities, target_columns, forecasts[method], period, guard_width
                )
    baseline_methods = [m for m in BASELINE_METHODS if m in wanted]
    if baseline_methods:
        forecasts.update(
            baseline_forecasts(options, entities, target_columns, horizon, baseline_methods, period)
        )
    for method in methods:
        if "+" in method:
            forecasts[method] = np.mean([forecasts[m] for m in method.split("+")], axis=0)
    return forecast_table(store, entities, target_columns, horizon, methods, forecasts)


def check_horizon(windows: ForecastWindows, horizon: int | None, model: bool) -> int:
    """The horizon to forecast (default: the run's H), checked before anything is
    allocated for it.

    Args:
        model: whether the learner forecasts (else only baselines do).

    Raises:
        ValueError: a horizon below 1, beyond H for a run whose forecasts cannot be fed
            back as inputs (it reads columns it does not forecast), or beyond
            `MAX_ROLLS` times H.
    """
    if horizon is None:
        return windows.horizon
    if isinstance(horizon, bool) or int(horizon) != horizon or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
    horizon = int(horizon)
    if horizon <= windows.horizon:
        return horizon
    if model and not windows.rolls_forward:
        raise ValueError(
            f"horizon={horizon}: the run forecasts at most H={windows.horizon} steps (it reads "
            "columns it does not forecast, so its forecasts cannot be fed back as inputs)"
        )
    if horizon > MAX_ROLLS * windows.horizon:
        raise ValueError(
            f"horizon={horizon}: at most {MAX_ROLLS * windows.horizon} steps ({MAX_ROLLS} times "
            f"the run's H={windows.horizon}, forecasts fed back as inputs)"
        )
    return horizon


def check_methods(methods: Sequence[str]) -> set[str]:
    """The single methods `methods` names (`adapted+theta` names two).

    Raises:
        ValueError: no methods, a string instead of a list, or an unknown method.
    """
    known = {*MODEL_METHODS, *BASELINE_METHODS}
    if isinstance(methods, str) or not methods:
        raise ValueError(f"methods must be a non-empty list of names, got {methods!r}")
    wanted: set[str] = set()
    for method in methods:
        parts = method.split("+")
        unknown = [p for p in parts if p not in known]
        if unknown:
            raise ValueError(
                f"unknown forecast method {unknown[0]!r}; use {', '.join(sorted(known))} or a "
                "combination such as adapted+theta"
            )
        wanted.update(parts)
    return wanted


def forecast_batch(spec: ForecastWindows, entities: list[Entity], horizon: int) -> MetaBatch:
    """The evaluation's task for each entity, with its query window past the history's
    end: support windows ending at the history's end, query input its last L rows.

    Returns:
        `MetaBatch` with `support.x [B, K, L, F]`, `support.y [B, K, H, T]`,
        `query.x [B, 1, L, F]` and zeros for `query.y [B, 1, horizon, T]`.

    Raises:
        ValueError: an entity too short for the run's windows.
    """
    windows = spec.end_windows
    support_x, support_y, query_x = [], [], []
    for entity in entities:
        assert entity.scaled is not None
        num_rows = len(entity.scaled)
        if num_rows < windows.rows_needed:
            raise ValueError(
                f"history: entity {entity.key!r} has {num_rows} rows; the run adapts on "
                f"{windows.num_support} windows of {windows.lookback} + {windows.horizon} rows "
                f"(stride {windows.stride}, up to {windows.pad_inputs} padded), so it needs at "
                f"least {windows.rows_needed}"
            )
        x, y, query = windows.cut(entity.scaled, spec.input_columns, spec.target_columns)
        support_x.append(x)
        support_y.append(y)
        query_x.append(query)
    num = len(entities)
    num_targets = len(spec.target_columns)
    return MetaBatch(
        support=TaskSet(
            torch.from_numpy(np.stack(support_x)), torch.from_numpy(np.stack(support_y))
        ),
        query=TaskSet(
            torch.from_numpy(np.stack(query_x)),
            torch.zeros(num, 1, horizon, num_targets),  # unknown: only its shape is read
        ),
        entity_index=torch.full((num,), -1, dtype=torch.int64),
        stratum=torch.zeros(num, dtype=torch.int64),
        split_time=torch.full((num,), -1, dtype=torch.int64),
    )


def model_forecasts(
    learner: AdaptingLearner, batch: MetaBatch, methods: list[str], steps: int | None
) -> dict[str, np.ndarray]:
    """`{method: [B, horizon, T] float64}` scaled forecasts of the learner, adapted on the
    support windows (`adapted`) or not (`unadapted`)."""
    learner.eval()
    parameter = next(learner.parameters(), None)
    if parameter is not None:
        batch = batch.to(parameter.device)
    out = {}
    with torch.no_grad():
        for method in methods:
            params = learner.adapt(batch.support, steps=steps if method == "adapted" else 0)
            prediction = _forecast(_predictor(learner, params), batch)
            out[method] = prediction[:, 0].double().cpu().numpy()  # [B, horizon, T]
    return out


def _predictor(learner: AdaptingLearner, params: Params) -> Callable[[torch.Tensor], torch.Tensor]:
    def predict(x: torch.Tensor) -> torch.Tensor:
        return learner.predict(params, x)

    return predict


def guarded(
    options: EvalOptions,
    entities: list[Entity],
    target_columns: list[int],
    values: np.ndarray,
    period: int | None,
    width: float,
) -> np.ndarray:
    """`values [B, horizon, T]` (original units) clipped to each entity's plausibility
    band of each target at `width`, from its history's finite values and its seasonal
    period (`period`, else the run's)."""
    out = values.copy()
    for b, entity in enumerate(entities):
        m = period_of(options, entity, period, "the guard")
        for t, column in enumerate(target_columns):
            history = entity.values[:, column]
            out[b, :, t] = guard(values[b, :, t], history[np.isfinite(history)], m, width)
    return out


def period_of(options: EvalOptions, entity: Entity, period: int | None, needs: str) -> int:
    """The seasonal period of `entity`: `period`, else the run's `eval.seasonal_period`
    (by the entity's stratum or label where it is a mapping), else 1.

    Raises:
        ValueError: the run's period is a mapping the entity's stratum or label does not
            key (`needs` names what asked for it).
    """
    if period is not None:
        return int(period)
    keyed_by = options.seasonal_period_from
    known = entity.stratum if keyed_by == "stratum" else entity.label
    if isinstance(options.seasonal_period, dict) and not known:
        raise ValueError(
            f"{needs} needs the seasonal period of entity {entity.key!r}: the run's "
            f"eval.seasonal_period is a mapping by {keyed_by}, which the history does not "
            "hold; pass period=M"
        )
    return int(options.period_of(entity.stratum, entity.label) or 1)


def baseline_forecasts(
    options: EvalOptions,
    entities: list[Entity],
    target_columns: list[int],
    horizon: int,
    methods: list[str],
    period: int | None,
) -> dict[str, np.ndarray]:
    """`{method: [B, horizon, T] float64}` baseline forecasts from each entity's history in
    original units; the seasonal period is `period`, else the run's `eval.seasonal_period`.

    Raises:
        ValueError: a seasonal method, no `period`, and a run whose seasonal period is a
            mapping the entity's stratum or label does not key.
    """
    needs_period = sorted({"seasonal_naive", "theta"} & set(methods))
    out: dict[str, list[np.ndarray]] = {m: [] for m in methods}
    for entity in entities:
        history = entity.values[:, target_columns]
        m = period_of(options, entity, period, needs_period[0]) if needs_period else 1
        if "naive" in methods:
            out["naive"].append(baselines.naive_forecast(history, horizon))
        if "seasonal_naive" in methods:
            out["seasonal_naive"].append(baselines.seasonal_naive_forecast(history, horizon, m))
        if "theta" in methods:
            out["theta"].append(baselines.theta_forecast(history, horizon, m))
    return {m: np.stack(v).astype(np.float64) for m, v in out.items()}


def forecast_table(
    store: StoreSchema,
    entities: list[Entity],
    target_columns: list[int],
    horizon: int,
    methods: Sequence[str],
    forecasts: dict[str, np.ndarray],
) -> pa.Table:
    """The long-format table `Run.forecast` returns: one row per entity, step and method,
    the times continuing each entity's history in the history's time type."""
    meta = store.metadata
    num, num_methods = len(entities), len(methods)
    shape = (num, horizon, num_methods)  # the rows, in this order
    index = np.indices(shape).reshape(3, -1)
    time_type = entities[0].time_type
    assert time_type is not None
    times = np.stack(
        [next_times(e.key, int(e.times[-1]), e.step, horizon, time_type) for e in entities]
    )
    columns = {
        meta["entity_col"]: pa.array([e.key for e in entities]).take(index[0]),
        "step": pa.array(index[1] + 1, pa.int64()),
        meta["time_col"]: time_column(times[index[0], index[1]], time_type),
        "method": pa.array(list(methods)).take(index[2]),
    }
    values = np.stack([forecasts[m] for m in methods], axis=2)  # [B, horizon, M, T]
    for t, c in enumerate(target_columns):
        columns[store.column_names[c]] = pa.array(values[..., t].reshape(-1), pa.float64())
    return pa.table(columns)
