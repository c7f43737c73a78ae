"""A forecast kept within what its series' own history makes plausible.

A model forecast for a series is clipped, step by step, to a band built from that series'
history alone (no data-set knowledge): each forecast step starts from the history's value
one season earlier (the seasonal naive forecast, the last value where the period is 1)
and may grow, per season ahead, as much as the history's own growth over one season
(`y_t` against `y_{t-m}`) allows. That growth is taken as Tukey's fences of the history's
per-season growth rates: from the first quartile less `width` interquartile ranges to
the third quartile plus `width` of them. The rates are log ratios where the whole history
is positive (growth compounds over the seasons ahead) and differences otherwise
(growth adds up). A history with no full season before its last value gets no band.

`width` is chosen per group (a frequency) on validation forecasts (`fit_width`), from
`WIDTHS`: `None` (no guard) and widths from 0 (the history's middle half of growth rates)
to 3 (far outside it); a tie keeps the wider band, `None` above all. A run records the
width chosen for it (`write_guard`, `guard.json`), which its forecasts then apply.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from metadist.durable import atomic_write_text
from metadist.eval.fallback_combination import pooled_score
from metadist.eval.metrics import point_terms

# the band widths tried, in interquartile ranges of the history's growth; None: no guard
WIDTHS: tuple[float | None, ...] = (None, 0.0, 0.5, 1.0, 1.5, 3.0)
# a run's recorded width (`write_guard`), beside its config
GUARD_FILE = "guard.json"


def growth_rates(history: np.ndarray, period: int) -> tuple[np.ndarray, bool]:
    """The history's growth over each season: `[N - period]` log ratios
    `log(y_t / y_{t-period})` where every value is positive (`True` second), else the
    differences `y_t - y_{t-period}` (`False`); empty where `N <= period`.

    Raises:
        ValueError: a period below 1 or a non-finite history value.
    """
    history = _history(history)
    period = _period(period)
    if len(history) <= period:
        return np.empty(0), True
    if (history > 0).all():
        return np.log(history[period:] / history[:-period]), True
    return history[period:] - history[:-period], False


def band(
    history: np.ndarray, horizon: int, period: int, width: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """`(lower [horizon], upper [horizon])`: the values step `h` (1-based) of a forecast
    of `history [N]` may take at `width` (see the module); `-inf`/`inf` throughout where
    `width` is None or the history has no full season before its last value.

    Raises:
        ValueError: a horizon below 1, a negative width, and `growth_rates`'s.
    """
    if isinstance(horizon, bool) or int(horizon) != horizon or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
    if width is not None and not (np.isfinite(width) and width >= 0):
        raise ValueError(f"width must be None or a finite number >= 0, got {width!r}")
    rates, relative = growth_rates(history, period)
    unbounded = np.full(horizon, -np.inf), np.full(horizon, np.inf)
    if width is None or len(rates) == 0:
        return unbounded
    history, period = _history(history), _period(period)
    steps = np.arange(horizon)
    reference = history[len(history) - period + steps % period]  # seasonal naive
    seasons = steps // period + 1  # how many seasons ahead step h lies
    q1, q3 = np.quantile(rates, [0.25, 0.75])
    low, high = q1 - width * (q3 - q1), q3 + width * (q3 - q1)
    if relative:
        return reference * np.exp(seasons * low), reference * np.exp(seasons * high)
    return reference + seasons * low, reference + seasons * high


def guard(
    forecast: np.ndarray, history: np.ndarray, period: int, width: float | None
) -> np.ndarray:
    """`forecast [H]` clipped to `band(history, H, period, width)`; a non-finite
    forecast value stays as it is (the evaluation reports it as such)."""
    forecast = np.asarray(forecast, np.float64)
    if forecast.ndim != 1:
        raise ValueError(f"forecast must be one series' steps [H], got shape {forecast.shape}")
    lower, upper = band(history, len(forecast), period, width)
    return np.where(np.isfinite(forecast), np.clip(forecast, lower, upper), forecast)


def guard_points(
    model: np.ndarray,
    tasks: np.ndarray,
    histories: dict[str, np.ndarray],
    period: int | np.ndarray,
    width: float | None,
) -> np.ndarray:
    """`model [P]` forecast points guarded series by series: the points of task `t`
    (`tasks [P]`, in step order) clipped to the band of `histories[t]`, with the
    seasonal `period` of all points or of each (`[P]`, one per task).

    Raises:
        ValueError: a task without a history, and `guard`'s.
    """
    model = np.asarray(model, np.float64)
    tasks = np.asarray(tasks).astype(str)
    periods = np.broadcast_to(np.asarray(period), tasks.shape)
    if len(model) != len(tasks):
        raise ValueError("guard_points: model and tasks differ in length")
    out = model.copy()
    if width is None:
        return out
    for task in dict.fromkeys(tasks.tolist()):
        if task not in histories:
            raise ValueError(f"guard_points: series {task!r} has no history")
        rows = np.flatnonzero(tasks == task)
        out[rows] = guard(model[rows], histories[task], int(periods[rows[0]]), width)
    return out


def fit_width(
    metric: str,
    truth: np.ndarray,
    model: np.ndarray,
    tasks: np.ndarray,
    histories: dict[str, np.ndarray],
    period: int | np.ndarray,
    scale: np.ndarray | None = None,
    widths: Sequence[float | None] = WIDTHS,
) -> tuple[float | None, dict[str, float]]:
    """The width of `widths` whose guarded forecast scores best by `metric`, pooled as
    the evaluation's tables pool (`fallback_combination.pooled_score`).

    Args:
        metric: one of `metrics.POINT_METRICS` (the data set's metric).
        truth, model: `[P]` the points' values (validation truth) and the model forecast.
        tasks: `[P]` the series of each point, its points in step order.
        histories: each series' history before its points.
        period: the seasonal period of every point, or of each (`[P]`).
        scale: `[P]` MASE's scale of each point's series (MASE only).

    Returns:
        `(width, {label(width): pooled score})`, labels from `width_label`; on a tie the
        wider band (None, no guard, above all); None where no score is finite.

    Raises:
        ValueError: arrays of different lengths, and `guard_points`'s.
    """
    if len({len(np.asarray(a)) for a in (truth, model, tasks)}) != 1:
        raise ValueError("fit_width: truth, model and tasks differ in length")
    scores: dict[str, float] = {}
    for width in widths:
        guarded = guard_points(model, tasks, histories, period, width)
        terms = point_terms(metric, truth, guarded, scale)
        scores[width_label(width)] = pooled_score(terms, tasks)
    finite = [w for w in widths if np.isfinite(scores[width_label(w)])]
    if not finite:
        return None, scores

    def rank(width: float | None) -> tuple[float, float]:
        return scores[width_label(width)], -(np.inf if width is None else width)

    return min(finite, key=rank), scores


def width_label(width: float | None) -> str:
    """The key of a width in `choices.json`: `"none"` or the number (`"1.5"`)."""
    return "none" if width is None else f"{float(width):g}"


def parse_width(label: object) -> float | None:
    """The width `width_label` wrote (None for `"none"` or a JSON null).

    Raises:
        ValueError: anything else that is not a number >= 0.
    """
    if label is None or label == "none":
        return None
    try:
        width = float(label)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"guard width must be 'none' or a number >= 0, got {label!r}") from None
    if not (np.isfinite(width) and width >= 0):
        raise ValueError(f"guard width must be 'none' or a number >= 0, got {label!r}")
    return width


def _history(history: np.ndarray) -> np.ndarray:
    history = np.asarray(history, np.float64).reshape(-1)
    if not np.isfinite(history).all():
        raise ValueError("history: every value must be finite")
    return history


def _period(period: int) -> int:
    if isinstance(period, bool) or int(period) != period or period < 1:
        raise ValueError(f"period must be an integer >= 1, got {period!r}")
    return int(period)


def write_guard(
    run_dir: str | os.PathLike, width: float | None, source: str = "", model: str | None = None
) -> None:
    """Records in `run_dir` (`guard.json`) the band width its model's forecasts are
    guarded with (`Run.forecast` applies it); `source`: where it was chosen; `model`:
    the forecast reported as the model (`adapted` or `unadapted`, chosen on validation;
    `Run.forecast`'s default), where one was chosen."""
    document: dict[str, str | None] = {"width": width_label(width), "chosen_on": source}
    if model is not None:
        document["model"] = model
    atomic_write_text(Path(run_dir) / GUARD_FILE, json.dumps(document, indent=1) + "\n")


def recorded_guard(run_dir: str | os.PathLike) -> float | None:
    """The width `run_dir` records (`write_guard`); None where it records none.

    Raises:
        ValueError: a `guard.json` that is not one `write_guard` writes.
    """
    path = Path(run_dir) / GUARD_FILE
    if not path.is_file():
        return None
    try:
        label = json.loads(path.read_text())["width"]
        return parse_width(label)
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path} does not hold a guard width as metadist records it") from None


def recorded_model(run_dir: str | os.PathLike) -> str | None:
    """The forecast `run_dir` records as its model (`write_guard`'s `model`: `adapted`
    or `unadapted`); None where it records none.

    Raises:
        ValueError: a `guard.json` whose model is neither.
    """
    path = Path(run_dir) / GUARD_FILE
    if not path.is_file():
        return None
    try:
        model = json.loads(path.read_text()).get("model")
    except (ValueError, AttributeError):
        raise ValueError(f"{path} does not hold a guard as metadist records it") from None
    if model not in (None, "adapted", "unadapted"):
        raise ValueError(f"{path}: model {model!r} is neither adapted nor unadapted")
    return model
