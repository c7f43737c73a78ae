"""The times of a forecast: the next H times after a history, in the history's own type.

A history's time column holds integers, dates or timestamps (any unit or time zone). Its
rows must be regularly spaced, as forecasting the next H *steps* presumes: a fixed step
(`2`, one day, one hour), or for dates and timestamps a fixed number of calendar months
(monthly, quarterly or yearly data: the same day of the month and time of day, or every
row at its month's end); with a time zone, either in UTC or in the zone's wall-clock time
(daily or monthly rows at local midnight, which daylight saving moves in UTC). A history
with a gap is refused in one line naming the entity and the gap (in months for monthly
data), one whose steps are irregular (a step shorter than its usual one, or not a
multiple of it) in one line naming the two steps and where. The forecast's times continue
the history's step and come back in the time column's type. Times in messages are shown
as the user wrote them: a timestamp with a time zone in that zone's wall-clock time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metadist.store.sources import first_beyond_nanoseconds

_INT64_MAX = np.iinfo(np.int64).max
_DAY = 86_400 * 10**9  # nanoseconds
# calendar units shown in messages, largest first, in nanoseconds
_UNITS: tuple[tuple[str, int], ...] = (
    ("day", 86_400 * 10**9),
    ("hour", 3_600 * 10**9),
    ("minute", 60 * 10**9),
    ("second", 10**9),
    ("millisecond", 10**6),
    ("microsecond", 10**3),
)


@dataclass(frozen=True)
class Step:
    """The spacing of a history's rows: `size` time units (integers, days of a date
    column, nanoseconds of a timestamp column), or `months` calendar months, anchored
    `offset` after the month's start (or, with `from_end`, before the next month's); with
    `local`, in the wall-clock time of the column's time zone (daily or monthly rows at
    local midnight are not regular in UTC across daylight-saving changes)."""

    size: int = 0
    months: int = 0
    offset: int = 0
    from_end: bool = False
    local: bool = False  # regular in the column's time zone's wall-clock time, not in UTC


def time_numbers(
    column: pa.ChunkedArray, name: str, entities: pa.ChunkedArray | None = None
) -> np.ndarray:
    """`[m]` int64 times of a history's time column: integers as they are, dates as days
    and timestamps as nanoseconds since the epoch.

    Args:
        entities: the history's entity column, to name the entity of a time refused.

    Raises:
        ValueError: null times, a timestamp beyond int64 nanoseconds (the years 1677 to
            2262, as a store holds them), or a column of another type.
    """
    if column.null_count:
        raise ValueError(f"history: column {name!r} has null times")
    if pa.types.is_timestamp(column.type):
        try:
            column = pc.cast(column, pa.timestamp("ns")).cast(pa.int64())
        except pa.ArrowInvalid:  # a time its unit holds, nanoseconds do not
            raise ValueError(_beyond_nanoseconds(column, name, entities)) from None
    elif pa.types.is_date(column.type):
        column = pc.cast(column, pa.date32()).cast(pa.int32()).cast(pa.int64())
    elif not pa.types.is_integer(column.type):
        raise ValueError(
            f"history: column {name!r} must hold integers, dates or timestamps, got {column.type}"
        )
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def _beyond_nanoseconds(
    column: pa.ChunkedArray, name: str, entities: pa.ChunkedArray | None
) -> str:
    """The message for the first timestamp of `column` beyond int64 nanoseconds."""
    row, shown = first_beyond_nanoseconds(column)
    whose = "" if entities is None else f" (entity {str(entities[row].as_py())!r})"
    return (
        f"history: row {row}{whose}: column {name!r} holds {shown}, beyond the times "
        "metadist forecasts in (int64 nanoseconds since 1970, the years 1677 to 2262, as a "
        "store keeps them)"
    )


def regular_step(key: str, times: np.ndarray, kind: pa.DataType, extra: str = "") -> Step | None:
    """The step of an entity's sorted, distinct `times` (as `time_numbers` gives them);
    None for a single row (too short for any run's windows, which says so).

    Args:
        key: the entity, for the message.
        kind: the time column's type.
        extra: what the message suggests besides adding the missing rows.

    Raises:
        ValueError: rows that are not regularly spaced (naming the entity and the first
            gap).
    """
    if len(times) < 2:
        return None
    zone = _zone(kind)
    local = to_local(times, zone) if zone is not None else times
    if zone is not None:  # whole days or months of the zone's wall-clock time come first
        spacing = np.diff(local)
        if (spacing == spacing[0]).all() and spacing[0] % _DAY == 0:
            return Step(size=int(spacing[0]), local=True)
        monthly = _monthly_step(local, kind)
        if monthly is not None:
            return Step(monthly.size, monthly.months, monthly.offset, monthly.from_end, True)
    spacing = np.diff(times)
    if (spacing == spacing[0]).all():
        return Step(size=int(spacing[0]))
    if not pa.types.is_integer(kind):
        monthly = _monthly_step(times, kind)
        if monthly is not None:
            return monthly
    # the gap in UTC where the rows keep a fixed step there (hours across daylight
    # saving), else in the zone's wall-clock time; shown in wall-clock time either way
    where, usual, found, gap = _first_gap(
        local if zone is not None and _calendar(local) else times, kind
    )
    after = (
        f"time {shown_time(times[where], kind)} is followed by {shown_time(times[where + 1], kind)}"
    )
    if not gap:  # a shorter step, or one rows added cannot make regular
        raise ValueError(
            f"history: entity {key!r} has irregular steps: {after}, {found} later, where its "
            f"rows are otherwise {usual} apart; forecasts continue a history of one regular step"
        )
    raise ValueError(
        f"history: entity {key!r} has a gap: {after}, where its rows are otherwise "
        f"{usual} apart; forecasts continue a regular history: add the missing rows{extra}"
    )


def _calendar(local: np.ndarray) -> bool:
    """Whether wall-clock times keep one place in their days (daily or monthly data at,
    say, local midnight), so a gap is looked for in wall-clock time."""
    return bool((local % _DAY == local[0] % _DAY).all())


def _first_gap(times: np.ndarray, kind: pa.DataType) -> tuple[int, str, str, bool]:
    """`(row, usual step shown, its step shown, gap)`: where `times` first leave their
    usual spacing by a step that is not a multiple of it (irregular steps), else where
    they first skip rows (`gap`); in calendar months where the rows keep one place in
    their months (monthly, quarterly or yearly data, whose spacing in days varies), else
    in the time unit."""
    spacing, in_months = np.diff(times), False
    if not pa.types.is_integer(kind):
        unit = "ns" if pa.types.is_timestamp(kind) else "D"
        months = times.astype(f"datetime64[{unit}]").astype("datetime64[M]")
        starts = months.astype(f"datetime64[{unit}]").astype(np.int64)
        after_start = times - starts
        if (after_start == after_start[0]).all():
            spacing, in_months = np.diff(months.astype(np.int64)), True
    values, counts = np.unique(spacing, return_counts=True)
    usual = int(values[np.argmax(counts)])
    irregular = np.flatnonzero(spacing % usual != 0)
    row = int(irregular[0] if irregular.size else np.flatnonzero(spacing != usual)[0])

    def shown(size: int) -> str:
        return f"{size} month{'s' * (size != 1)}" if in_months else _shown_step(size, kind)

    return row, shown(usual), shown(int(spacing[row])), not irregular.size


def _zone(kind: pa.DataType) -> str | None:
    """The time zone of a timestamp column, or None."""
    return kind.tz if pa.types.is_timestamp(kind) and kind.tz else None


def to_local(times: np.ndarray, zone: str) -> np.ndarray:
    """UTC nanoseconds as the zone's wall-clock nanoseconds."""
    column = pa.array(times, pa.int64()).cast(pa.timestamp("ns", tz=zone))
    return np.asarray(pc.local_timestamp(column).cast(pa.int64()).to_numpy(), np.int64)


def from_local(times: np.ndarray, zone: str) -> np.ndarray:
    """The zone's wall-clock nanoseconds as UTC nanoseconds: an ambiguous wall-clock
    time taken at its earliest, one the clocks skip at the first time after the gap (a
    skipped local midnight is that day's first hour, not the day before)."""
    column = pa.array(times, pa.int64()).cast(pa.timestamp("ns"))
    utc = pc.assume_timezone(column, timezone=zone, ambiguous="earliest", nonexistent="latest")
    return np.asarray(utc.cast(pa.int64()).to_numpy(), np.int64)


def next_times(
    key: str, last: int, step: Step | None, horizon: int, kind: pa.DataType
) -> np.ndarray:
    """`[horizon]` int64 times that follow `last` by `step` (in `time_numbers`' units);
    `step` is None only for a single row, which no run forecasts from.

    Raises:
        ValueError: times beyond what the column's type can hold.
    """
    if step is None:  # read_history refuses a one-row entity; a caller of its own may not
        raise ValueError(f"history: entity {key!r} has one row: its time step cannot be known")
    zone = _zone(kind)
    if step.local and zone is not None:
        plain = Step(step.size, step.months, step.offset, step.from_end)
        wall = next_times(
            key,
            int(to_local(np.array([last], np.int64), zone)[0]),
            plain,
            horizon,
            pa.timestamp("ns"),
        )
        return from_local(wall, zone)
    steps = np.arange(1, horizon + 1, dtype=np.int64)
    if step.months:
        unit = "ns" if pa.types.is_timestamp(kind) else "D"
        month = np.array([last], np.int64).astype(f"datetime64[{unit}]").astype("datetime64[M]")
        months = month + steps * step.months
        if step.from_end:
            ends = (months + 1).astype(f"datetime64[{unit}]").astype(np.int64)
            return ends - step.offset
        return months.astype(f"datetime64[{unit}]").astype(np.int64) + step.offset
    if int(last) + horizon * step.size > _INT64_MAX:
        raise ValueError(
            f"history: entity {key!r}: {horizon} steps after {shown_time(last, kind)} are beyond "
            "the times a time column holds"
        )
    return int(last) + steps * step.size


def time_column(numbers: np.ndarray, kind: pa.DataType) -> pa.Array:
    """`numbers` (as `time_numbers` gives them) as a column of type `kind`."""
    if pa.types.is_timestamp(kind):
        return pa.array(numbers, pa.int64()).cast(pa.timestamp("ns", kind.tz)).cast(kind)
    if pa.types.is_date(kind):
        return pa.array(numbers, pa.int64()).cast(pa.int32()).cast(pa.date32()).cast(kind)
    return pa.array(numbers, pa.int64()).cast(kind)


def _monthly_step(times: np.ndarray, kind: pa.DataType) -> Step | None:
    """The calendar-month step of `times` (same place in every month, or every row at
    the same distance before its month's end), or None."""
    unit = "ns" if pa.types.is_timestamp(kind) else "D"
    moments = times.astype(f"datetime64[{unit}]")
    months = moments.astype("datetime64[M]")
    spacing = np.diff(months.astype(np.int64))
    if spacing[0] < 1 or not (spacing == spacing[0]).all():
        return None
    starts = months.astype(f"datetime64[{unit}]").astype(np.int64)
    ends = (months + 1).astype(f"datetime64[{unit}]").astype(np.int64)
    after_start, before_end = times - starts, ends - times
    if (after_start == after_start[0]).all():
        return Step(months=int(spacing[0]), offset=int(after_start[0]))
    if (before_end == before_end[0]).all():
        return Step(months=int(spacing[0]), offset=int(before_end[0]), from_end=True)
    return None


def shown_time(value: int, kind: pa.DataType | None) -> str:
    """A time (as `time_numbers` gives it) as a user wrote it, for messages: a timestamp
    of a column with a time zone in the zone's wall-clock time, with its UTC offset."""
    if kind is None:
        return str(int(value))
    if pa.types.is_timestamp(kind):  # in the column's time zone, with its offset
        return str(pa.scalar(int(value), pa.timestamp("ns", kind.tz)).as_py())
    if pa.types.is_date(kind):
        return str(np.datetime64(int(value), "D"))
    return str(int(value))


def _shown_step(size: int, kind: pa.DataType) -> str:
    if pa.types.is_date(kind):
        size, kind = size * 86_400 * 10**9, pa.timestamp("ns")
    if not pa.types.is_timestamp(kind):
        return str(size)
    for name, length in _UNITS:
        if size % length == 0:
            count = size // length
            return f"{count} {name}{'' if count == 1 else 's'}"
    return f"{size} nanoseconds"
