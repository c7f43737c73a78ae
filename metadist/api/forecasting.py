"""Forecasting new entities with a trained run (what `Run.forecast` does).

Each entity, scaled by the store's rule (`metadist.api.history`), becomes the task
evaluation would cut from it with `split="end"`: support windows ending where its history
ends, the query input its last L rows (`metadist.tasks.series_end`). An entity too short
for those windows, and every entity of a competition's member run, is cut as the
competition's holdout evaluation cuts it: front-filled with its first row, on fewer
support windows (`metadist.tasks.holdout`). The learner adapts on the support windows and
forecasts the next steps, which go back to the entity's original units; the baselines
forecast from the history in original units. A run that records a plausibility band
(`guard.json`, chosen on validation by `metadist competition`) has its model's forecasts
clipped to each entity's band (`metadist.eval.plausibility`), as the competition scored
it, unless the caller turns the guard off; the table then says which points were clipped.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from metadist.api.forecast_baselines import baseline_forecasts, period_of
from metadist.api.history import Entity, History, read_history, scale_entity, unscale
from metadist.api.protocols import AdaptingLearner, StoreSchema
from metadist.api.times import next_times, time_column
from metadist.batch import MetaBatch, TaskSet
from metadist.eval.plausibility import guard, width_label
from metadist.eval.scoring import _forecast
from metadist.eval.settings import EvalOptions
from metadist.eval.task_scores import diverged as diverged_task
from metadist.learners.base import Params
from metadist.progress import Counter, Progress
from metadist.tasks.inference import ForecastWindows, forecast_windows
from metadist.tasks.series_end import SeriesEndWindows

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
    holdout_padding: bool = False,
    progress: bool | None = None,
) -> pa.Table:
    """`Run.forecast` of a forecasting run's parts (see there for the arguments);
    `guard_width`: the band width that clips the model's forecasts (`adapted`,
    `unadapted` and combinations with them; None: no guard), the table then has a
    boolean column `clipped` (a target's model forecast moved into its band) and one
    line on stderr counts them; `holdout_padding`: cut every entity as a competition's
    holdout evaluation does (`forecast_batches`); `progress`: show the entities read,
    adapted and forecast by the baselines (`metadist.progress.Progress`: default, bars
    on a terminal, else a line every 15 s, so long work is never silent).

    Raises:
        ValueError: a sampler without the forecasting protocol
            (`metadist.tasks.inference`), and what `Run.forecast` lists.
    """
    windows = forecast_windows(sampler, len(store.column_names))
    wanted = check_methods(methods)
    horizon = check_horizon(windows, horizon, bool(wanted & set(MODEL_METHODS)))
    with Progress(progress, transient=True) as display:
        entities = [scale_entity(store, e) for e in read_history(history, store, display)]
        return _forecast_entities(
            learner, store, options, windows, entities, display,
            horizon=horizon, methods=methods, wanted=wanted, period=period, steps=steps,
            guard_width=guard_width, holdout_padding=holdout_padding,
        )  # fmt: skip


def _forecast_entities(
    learner: AdaptingLearner,
    store: StoreSchema,
    options: EvalOptions,
    windows: ForecastWindows,
    entities: list[Entity],
    display: Progress,
    *,
    horizon: int,
    methods: Sequence[str],
    wanted: set[str],
    period: int | None,
    steps: int | None,
    guard_width: float | None,
    holdout_padding: bool,
) -> pa.Table:
    """`forecast` of the entities read and scaled, its counters shown on `display`."""
    target_columns = list(windows.target_columns)
    forecasts: dict[str, np.ndarray] = {}
    clipped: dict[str, np.ndarray] = {}
    model_methods = [m for m in MODEL_METHODS if m in wanted]
    if model_methods:
        batches = forecast_batches(windows, entities, horizon, holdout_padding)
        if steps is None:
            steps = options.inner_steps
        label = f"forecast: {'/'.join(model_methods)}"
        counter = display.counter(label, len(entities) * len(model_methods), "entities")
        scaled = model_forecasts(learner, batches, model_methods, steps, counter)
        for method, values in scaled.items():
            forecasts[method] = np.stack(
                [
                    unscale(store, entity, values[b], target_columns)
                    for b, entity in enumerate(entities)
                ]
            )
        diverged_as_nan(entities, forecasts, target_columns)
        for method in model_methods if guard_width is not None else ():
            assert guard_width is not None  # the loop runs only with a guard
            unguarded = forecasts[method]
            forecasts[method] = guarded(
                options, entities, target_columns, unguarded, period, guard_width
            )
            clipped[method] = forecasts[method] != unguarded  # NaN stays: not clipped
    baseline_methods = [m for m in BASELINE_METHODS if m in wanted]
    if baseline_methods:
        counter = display.counter(
            f"forecast: {'/'.join(baseline_methods)}", len(entities), "entities"
        )
        forecasts.update(
            baseline_forecasts(
                options, entities, target_columns, horizon, baseline_methods, period, counter
            )
        )
    for method in methods:
        if "+" in method:
            forecasts[method] = np.mean([forecasts[m] for m in method.split("+")], axis=0)
    table = forecast_table(store, entities, target_columns, horizon, methods, forecasts)
    if guard_width is None:
        return table
    return with_clipped(table, entities, horizon, methods, clipped, guard_width)


def with_clipped(
    table: pa.Table,
    entities: list[Entity],
    horizon: int,
    methods: Sequence[str],
    clipped: dict[str, np.ndarray],
    width: float,
) -> pa.Table:
    """`table` with the boolean column `clipped`: whether the guard moved a forecast
    point of a model method (or of a model method in a combination) into its band; one
    line on stderr counts them."""
    none = np.zeros((len(entities), horizon), bool)
    flags = [
        np.any(
            [clipped[m].any(axis=2) for m in method.split("+") if m in clipped] or [none], axis=0
        )
        for method in methods
    ]
    flag = np.stack(flags, axis=2)  # [B, horizon, M], the table's row order
    points = sum(int(clipped[m].sum()) for m in clipped)
    total = sum(clipped[m].size for m in clipped)
    name = free_name("clipped", set(table.column_names))  # a store's `clipped` stays
    print(
        f"note: the run's plausibility guard (band width {width_label(width)}, chosen on "
        f"validation) clipped {points} of {total} model forecast points (column {name}); "
        "guard=False (--no-guard) forecasts unguarded",
        file=sys.stderr,
    )
    return table.append_column(name, pa.array(flag.reshape(-1), pa.bool_()))


def diverged_as_nan(
    entities: list[Entity], forecasts: dict[str, np.ndarray], target_columns: list[int]
) -> None:
    """Sets each model forecast `forecasts[method] [B, horizon, T]` of an entity that
    diverged (evaluation's rule, `metadist.eval.task_scores.diverged`: not finite
    anywhere, or beyond 10⁶ times the largest value of its history's targets) to NaN
    throughout, as evaluation reports a diverged method rather than a number, and says
    so in one line on stderr naming the entities of each method."""
    found = []
    for method, values in forecasts.items():
        diverged = np.array(
            [
                diverged_task(values[b], entity.values[:, target_columns])
                for b, entity in enumerate(entities)
            ],
            dtype=bool,
        )
        if not diverged.any():
            continue
        values[diverged] = np.nan
        keys = [repr(e.key) for e, bad in zip(entities, diverged, strict=True) if bad]
        names = ", ".join(keys[:3]) + (" ..." if len(keys) > 3 else "")
        found.append(
            f"{method} of {len(keys)} {'entity' if len(keys) == 1 else 'entities'} ({names})"
        )
    if found:
        print(
            "warning: forecast diverged (not finite, or beyond 10^6 times the history's "
            f"largest value; its rows are NaN): {'; '.join(found)}",
            file=sys.stderr,
        )


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
        ValueError: no methods, a string instead of a list, an unknown method, or one
            named twice (its rows would be repeated).
    """
    known = {*MODEL_METHODS, *BASELINE_METHODS}
    if isinstance(methods, str) or not methods:
        raise ValueError(f"methods must be a non-empty list of names, got {methods!r}")
    wanted: set[str] = set()
    for index, method in enumerate(methods):
        parts = method.split("+")
        if method in methods[:index] or len(set(parts)) < len(parts):
            raise ValueError(
                f"forecast method {method!r} is named twice; name each method once"
                if method in methods[:index]
                else f"forecast method {method!r} combines a method with itself"
            )
        unknown = [p for p in parts if p not in known]
        if unknown:
            raise ValueError(
                f"unknown forecast method {unknown[0]!r}; use {', '.join(sorted(known))} or a "
                "combination such as adapted+theta"
            )
        wanted.update(parts)
    return wanted


def forecast_batches(
    spec: ForecastWindows, entities: list[Entity], horizon: int, holdout_padding: bool = False
) -> list[tuple[np.ndarray, MetaBatch]]:
    """The evaluation's task for each entity, with its query window past the history's
    end: support windows ending at the history's end, query input its last L rows.

    An entity shorter than the run's windows allow (`rows_needed` of its padded inputs),
    and every entity with `holdout_padding`, is cut as a competition's holdout evaluation
    cuts it (`metadist.tasks.holdout`): front-filled with its first row to one window,
    with as many support windows as fit (at least one).

    Returns:
        `[(indices [B'], batch)]`, one batch per number of support windows K': the
        positions in `entities` of its tasks, and a `MetaBatch` with `support.x
        [B', K', L, F]`, `support.y [B', K', H, T]`, `query.x [B', 1, L, F]` and zeros for
        `query.y [B', 1, horizon, T]`.
    """
    padded = spec.end_windows
    front_filled = SeriesEndWindows(
        spec.lookback, spec.horizon, spec.num_support, spec.stride, padding="series"
    )
    short = []
    cuts: dict[int, list[tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]]] = {}
    for index, entity in enumerate(entities):
        assert entity.scaled is not None
        num_rows = len(entity.scaled)
        windows = padded
        if holdout_padding or num_rows < padded.rows_needed:
            windows = front_filled
            if num_rows < padded.rows_needed:
                short.append(entity)
        cut = windows.cut(entity.scaled, spec.input_columns, spec.target_columns)
        cuts.setdefault(len(cut[0]), []).append((index, cut))
    if short and not holdout_padding:
        note_short(padded, short)
    return [
        (np.asarray([i for i, _ in group], np.int64), task_batch([c for _, c in group], horizon))
        for _, group in sorted(cuts.items())
    ]


def note_short(windows: SeriesEndWindows, short: list[Entity]) -> None:
    """One line on stderr naming the entities shorter than `windows` need, and how they
    are forecast instead."""
    lookback, horizon, k, stride, pad = (
        windows.lookback,
        windows.horizon,
        windows.num_support,
        windows.stride,
        windows.pad_inputs,
    )
    names = ", ".join(repr(e.key) for e in short[:3]) + (" ..." if len(short) > 3 else "")
    print(
        f"note: history: {len(short)} {'entity has' if len(short) == 1 else 'entities have'} "
        f"fewer than L + H + (K-1)*stride - padded = {lookback} + {horizon} + {k - 1}*{stride} "
        f"- {pad} = {windows.rows_needed} rows ({names}, the first with "
        f"{len(short[0].scaled) if short[0].scaled is not None else 0}): adapted on fewer "
        "windows, front-filled with its first row, as a competition's holdout evaluation does",
        file=sys.stderr,
    )


def task_batch(cuts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], horizon: int) -> MetaBatch:
    """One `MetaBatch` of tasks cut alike (`SeriesEndWindows.cut`'s triples, one K')."""
    support_x, support_y, query_x = zip(*cuts, strict=True)
    num, num_targets = len(cuts), support_y[0].shape[-1]
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
    learner: AdaptingLearner,
    batches: list[tuple[np.ndarray, MetaBatch]],
    methods: list[str],
    steps: int | None,
    counter: Counter | None = None,
) -> dict[str, np.ndarray]:
    """`{method: [B, horizon, T] float64}` scaled forecasts of the learner, adapted on the
    support windows (`adapted`) or not (`unadapted`), for `forecast_batches`' batches
    (each batch's entities counted on `counter` as each method is done)."""
    learner.eval()
    parameter = next(learner.parameters(), None)
    num = sum(len(indices) for indices, _ in batches)
    out: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for indices, batch in batches:
            if parameter is not None:
                batch = batch.to(parameter.device)
            for method in methods:
                params = learner.adapt(batch.support, steps=steps if method == "adapted" else 0)
                prediction = _forecast(_predictor(learner, params), batch)
                values = prediction[:, 0].double().cpu().numpy()  # [B', horizon, T]
                if method not in out:
                    out[method] = np.empty((num, *values.shape[1:]), np.float64)
                out[method][indices] = values
                if counter is not None:
                    counter.advance(len(indices))
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


def forecast_table(
    store: StoreSchema,
    entities: list[Entity],
    target_columns: list[int],
    horizon: int,
    methods: Sequence[str],
    forecasts: dict[str, np.ndarray],
) -> pa.Table:
    """The long-format table `Run.forecast` returns: one row per entity, step and method,
    the entity ids in the history's entity type, the times continuing each entity's
    history in the history's time type."""
    meta = store.metadata
    num, num_methods = len(entities), len(methods)
    shape = (num, horizon, num_methods)  # the rows, in this order
    index = np.indices(shape).reshape(3, -1)
    time_type = entities[0].time_type
    assert time_type is not None
    times = np.stack(
        [next_times(e.key, int(e.times[-1]), e.step, horizon, time_type) for e in entities]
    )
    targets = [store.column_names[c] for c in target_columns]
    taken = {meta["entity_col"], meta["time_col"], *targets}
    step, method = free_name("step", taken), free_name("method", taken)
    columns = {
        meta["entity_col"]: entity_column(entities).take(index[0]),
        step: pa.array(index[1] + 1, pa.int64()),
        meta["time_col"]: time_column(times[index[0], index[1]], time_type),
        method: pa.array(list(methods)).take(index[2]),
    }
    values = np.stack([forecasts[m] for m in methods], axis=2)  # [B, horizon, M, T]
    for t, name in enumerate(targets):
        columns[name] = pa.array(values[..., t].reshape(-1), pa.float64())
    return pa.table(columns)


def entity_column(entities: list[Entity]) -> pa.Array:
    """The entities' ids in the history's entity column type (integers stay integers, so
    the forecasts join back on the history)."""
    ids = [e.key if e.id is None else e.id for e in entities]
    return pa.array(ids, entities[0].id_type if entities[0].id is not None else None)


def free_name(name: str, taken: set[str]) -> str:
    """`name` for a column of the forecast table, or `forecast_<name>` where the store
    has a column of that name (its time column called `step`)."""
    return name if name not in taken else free_name(f"forecast_{name}", taken)
