"""What a sampler offers so that a trained run forecasts or classifies new data.

A run adapts to a new entity on windows cut from the entity's own history
(`metadist.api`), so it needs to know the windows its sampler cut in training. A sampler
says so with plain attributes (the built-in `forecast` and `nway_kshot` samplers have
them; a sampler of your own sets them in its `__init__`):

- to forecast (`Run.forecast`, `metadist forecast`): `lookback` (L input rows),
  `horizon` (H target rows), `num_support` (K support windows, the last K that end
  where the history ends), `input_columns` and `target_columns` (store column positions,
  `Sequence[int]`, of the window's inputs and of what it forecasts); optionally
  `stride` (rows between support windows, default 1) and `pad_inputs` (input rows that
  may lie before the history's first row, repeating it; default 0);
- to classify (`Run.classify`): `lookback` (rows of an example) and `input_columns`;
  optionally `resample` (examples are resampled to `lookback` rows instead of cut to
  their last ones; default False) and `z_normalise` (each example z-normalised per
  column over all its rows first; default False).

`forecast_windows(sampler)` and `classify_windows(sampler)` read them, or say in one
line which of them a sampler lacks; `protocol_attributes(sampler)` is what a run records
of them (`metadist.train.artifact`), so that it forecasts without its store.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from metadist.tasks.naming import sampler_label
from metadist.tasks.series_end import SeriesEndWindows

FORECAST_REQUIRED = ("lookback", "horizon", "num_support", "input_columns", "target_columns")
FORECAST_OPTIONAL = {"stride": 1, "pad_inputs": 0}
CLASSIFY_REQUIRED = ("lookback", "input_columns")
CLASSIFY_OPTIONAL = {"resample": False, "z_normalise": False}
ATTRIBUTES = tuple(
    dict.fromkeys((*FORECAST_REQUIRED, *FORECAST_OPTIONAL, *CLASSIFY_REQUIRED, *CLASSIFY_OPTIONAL))
)
DOCS = "docs/tasks.md, 'Forecasting and classifying with your sampler'"


@dataclass(frozen=True)
class ForecastWindows:
    """The windows a forecasting run adapts on and forecasts from (see the module
    docstring for each field)."""

    lookback: int
    horizon: int
    num_support: int
    stride: int
    pad_inputs: int
    input_columns: tuple[int, ...]
    target_columns: tuple[int, ...]

    @property
    def end_windows(self) -> SeriesEndWindows:
        """The K support windows ending at a history's end and the query input after them
        (inputs padded by up to `pad_inputs` rows), as the forecast sampler cuts them."""
        return SeriesEndWindows(
            self.lookback,
            self.horizon,
            self.num_support,
            self.stride,
            padding="inputs",
            pad_inputs=self.pad_inputs,
        )

    @property
    def rolls_forward(self) -> bool:
        """Whether forecasts can be fed back as inputs (a horizon beyond H): the model
        reads exactly the columns it forecasts."""
        return self.input_columns == self.target_columns


@dataclass(frozen=True)
class ClassifyWindows:
    """The examples a classifier run reads (see the module docstring)."""

    lookback: int | None
    input_columns: tuple[int, ...]
    resample: bool
    z_normalise: bool = False


def forecast_windows(sampler: Any, num_columns: int | None = None) -> ForecastWindows:
    """The forecasting protocol's attributes of `sampler`.

    Args:
        num_columns: the store's number of columns, to check the column positions.

    Raises:
        ValueError: one line naming the attributes the sampler lacks, or a bad value.
    """
    _check(sampler, FORECAST_REQUIRED, "forecast new entities", "forecasting")
    values = {name: getattr(sampler, name, default) for name, default in FORECAST_OPTIONAL.items()}
    windows = ForecastWindows(
        lookback=_count(sampler, "lookback", sampler.lookback),
        horizon=_count(sampler, "horizon", sampler.horizon),
        num_support=_count(sampler, "num_support", sampler.num_support),
        stride=_count(sampler, "stride", values["stride"]),
        pad_inputs=_count(sampler, "pad_inputs", values["pad_inputs"], minimum=0),
        input_columns=_columns(sampler, "input_columns", num_columns),
        target_columns=_columns(sampler, "target_columns", num_columns),
    )
    if windows.pad_inputs >= windows.lookback:
        raise ValueError(
            f"{sampler_label(sampler)}: pad_inputs={windows.pad_inputs} must be below lookback="
            f"{windows.lookback}"
        )
    return windows


def classify_windows(sampler: Any, num_columns: int | None = None) -> ClassifyWindows:
    """The classification protocol's attributes of `sampler` (`lookback` may be None
    for a sampler that resamples whole series).

    Raises:
        ValueError: one line naming the attributes the sampler lacks, or a bad value.
    """
    _check(sampler, CLASSIFY_REQUIRED, "classify new examples", "classification")
    lookback = sampler.lookback
    return ClassifyWindows(
        lookback=None if lookback is None else _count(sampler, "lookback", lookback),
        input_columns=_columns(sampler, "input_columns", num_columns),
        resample=bool(getattr(sampler, "resample", CLASSIFY_OPTIONAL["resample"])),
        z_normalise=bool(getattr(sampler, "z_normalise", CLASSIFY_OPTIONAL["z_normalise"])),
    )


def protocol_attributes(sampler: Any) -> dict[str, Any]:
    """The protocol attributes `sampler` has, as JSON values (what a run records)."""
    out: dict[str, Any] = {}
    for name in ATTRIBUTES:
        if not hasattr(sampler, name):
            continue
        value = getattr(sampler, name)
        if name.endswith("_columns"):
            out[name] = None if value is None else [int(c) for c in value]
        elif isinstance(value, (bool, type(None))):
            out[name] = value
        else:
            out[name] = int(value)
    return out


def _check(sampler: Any, required: Sequence[str], what: str, protocol: str) -> None:
    missing = [name for name in required if not hasattr(sampler, name)]
    if missing:
        lacks = ", ".join(missing)
        raise ValueError(
            f"{sampler_label(sampler)} cannot {what}: it lacks {lacks} of the {protocol} protocol "
            f"(attributes {', '.join(required)}; see {DOCS})"
        )


def _count(sampler: Any, name: str, value: Any, minimum: int = 1) -> int:
    try:
        integral = not isinstance(value, bool) and isinstance(value, numbers.Real)
        integral = integral and int(value) == value
    except (ValueError, OverflowError):  # NaN, inf
        integral = False
    if not integral:
        raise ValueError(f"{sampler_label(sampler)}: {name} must be an integer, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{sampler_label(sampler)}: {name} must be >= {minimum}, got {value!r}")
    return int(value)


def _columns(sampler: Any, name: str, num_columns: int | None) -> tuple[int, ...]:
    value = getattr(sampler, name)
    try:
        columns = tuple(int(c) for c in value)
        valid = all(float(c) == int(c) for c in value) and len(columns) > 0
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise ValueError(
            f"{sampler_label(sampler)}: {name} must be a non-empty list of store column positions "
            f"(integers), got {value!r}"
        )
    if num_columns is not None and not all(0 <= c < num_columns for c in columns):
        raise ValueError(
            f"{sampler_label(sampler)}: {name}={list(columns)} holds a position outside the store's "
            f"{num_columns} columns"
        )
    return columns
