"""The statistical baselines' forecasts of new entities (what `Run.forecast` gives for
`naive`, `seasonal_naive` and `theta`): from each entity's history in original units,
with the seasonal period given, or the one the run records for the entity's stratum or
label."""

from __future__ import annotations

import sys

import numpy as np

from metadist.api.history import Entity
from metadist.eval import baselines
from metadist.eval.settings import EvalOptions
from metadist.progress import Counter


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
    mapping = options.seasonal_period if isinstance(options.seasonal_period, dict) else None
    if mapping is not None and not known:
        if len(set(mapping.values())) == 1:  # the series it forecasts share one period
            return int(next(iter(mapping.values())))
        raise ValueError(
            f"{needs} needs the seasonal period of entity {entity.key!r}: the run's "
            f"eval.seasonal_period is a mapping by {keyed_by}, which the history does not "
            "hold; pass period=M"
        )
    try:
        return int(options.period_of(entity.stratum, entity.label) or 1)
    except ValueError as error:  # a label the run does not forecast
        raise ValueError(
            f"{needs}, entity {entity.key!r}: {error}; the run records the periods of the "
            "series it was made to forecast: pass period=M for others"
        ) from None


def baseline_forecasts(
    options: EvalOptions,
    entities: list[Entity],
    target_columns: list[int],
    horizon: int,
    methods: list[str],
    period: int | None,
    counter: Counter | None = None,
) -> dict[str, np.ndarray]:
    """`{method: [B, horizon, T] float64}` baseline forecasts from each entity's history in
    original units; the seasonal period is `period`, else the run's `eval.seasonal_period`
    (each entity counted on `counter` when its forecasts are done).

    Raises:
        ValueError: a seasonal method, no `period`, and a run whose seasonal period is a
            mapping the entity's stratum or label does not key.
    """
    needs_period = sorted({"seasonal_naive", "theta"} & set(methods))
    out: dict[str, list[np.ndarray]] = {m: [] for m in methods}
    shorter: list[tuple[str, int, int]] = []  # entities shorter than their period
    for entity in entities:
        history = entity.values[:, target_columns]
        m = period_of(options, entity, period, needs_period[0]) if needs_period else 1
        if m > 1 and (("theta" in methods and len(history) < 2 * m + 1) or m > len(history)):
            shorter.append((entity.key, m, len(history)))
        if "naive" in methods:
            out["naive"].append(baselines.naive_forecast(history, horizon))
        if "seasonal_naive" in methods:
            out["seasonal_naive"].append(baselines.seasonal_naive_forecast(history, horizon, m))
        if "theta" in methods:
            out["theta"].append(baselines.theta_forecast(history, horizon, m))
        if counter is not None:
            counter.advance(1)
    if shorter:
        key, m, rows = shorter[0]
        print(
            f"note: history: {len(shorter)} {'entity is' if len(shorter) == 1 else 'entities are'}"
            f" too short for period {m} ({key!r}: {rows} rows): seasonal naive needs a season, "
            "Theta 2 seasons + 1 row; without them they forecast without seasonality",
            file=sys.stderr,
        )
    return {m: np.stack(v).astype(np.float64) for m, v in out.items()}
