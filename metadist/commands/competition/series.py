"""The series scan: each label's horizon, period, series count and lengths, read from
a long-format training file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metadist.commands.competition.spec import SPEC_FILE, CompetitionSpec
from metadist.store.sources import open_parquet, to_int64_time


@dataclass(frozen=True)
class SeriesInfo:
    """What the pipeline learned of the training file: one entry per label."""

    horizons: dict[str, int]  # label -> H
    periods: dict[str, int]  # label -> m
    counts: dict[str, int]  # label -> number of series
    lengths: dict[str, tuple[int, int]]  # label -> (shortest, longest) training part
    strata: dict[str, int]  # stratum -> number of series
    series: dict[str, str] = field(default_factory=dict, compare=False)  # id -> label
    last_times: dict[str, int] = field(default_factory=dict, compare=False)  # id -> last t

    def labels_of(self, horizon: int) -> list[str]:
        return sorted(label for label, h in self.horizons.items() if h == horizon)


@dataclass(frozen=True)
class _Rows:
    """The rows of a training file in series order.

    Attributes:
        entity: `[N]` series id of each row, sorted (stably).
        order: `[N]` the file's row of each sorted row.
        starts: `[S]` first sorted row of each series.
    """

    entity: np.ndarray
    order: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, table: pa.Table, entity_col: str) -> _Rows:
        entity = np.asarray(table.column(entity_col).to_pylist(), dtype=object).astype(str)
        order = np.argsort(entity, kind="stable")
        entity = entity[order]
        starts = np.r_[0, np.flatnonzero(entity[1:] != entity[:-1]) + 1]
        return cls(entity, order, starts)

    def lengths(self) -> np.ndarray:
        """`[S]` number of rows of each series."""
        return np.diff(np.r_[self.starts, len(self.entity)])


def scan_series(path: Path, spec: CompetitionSpec) -> SeriesInfo:
    """Each label's horizon, period, series count and lengths, read from `path`.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: a missing column (naming the setting that names it), a null in a
            column read (naming its first row), a series whose label, horizon or period
            changes along it, a label whose series disagree on their horizon or period,
            a label with no horizon or period, or values < 1.
    """
    if not path.is_file():
        raise FileNotFoundError(f"no training file at {path}")
    wanted = _wanted_columns(path, spec)
    columns = list(dict.fromkeys([*wanted.values(), spec.time_col, spec.value_col]))
    table = pq.read_table(path, columns=columns)
    if table.num_rows == 0:
        raise ValueError(f"{path} has no rows")
    refuse_nulls(path, table, columns)
    # before anything is written (the ingest would refuse it later, naming its own options)
    finite_values(
        path, table, spec.value_col, "a competition's series hold finite numbers: drop or "
        "fill them in the file"
    )  # fmt: skip
    rows = _Rows.of(table, spec.entity_col)
    labels = _per_series(path, table, wanted, rows, "label_col")
    assert labels is not None
    label_set = sorted(set(labels.tolist()))
    horizons = _per_label(
        path,
        spec,
        "horizon",
        _per_series(path, table, wanted, rows, "horizon_col"),
        spec.horizons,
        labels,
    )
    periods = _per_label(
        path,
        spec,
        "period",
        _per_series(path, table, wanted, rows, "period_col"),
        spec.periods,
        labels,
    )
    strata_values = _per_series(path, table, wanted, rows, "stratum_col")
    strata: dict[str, int] = {}
    if strata_values is not None:
        names, counts = np.unique(strata_values, return_counts=True)
        strata = {str(n): int(c) for n, c in zip(names, counts, strict=True)}
    lengths = rows.lengths()
    return SeriesInfo(
        horizons=horizons,
        periods=periods,
        counts={label: int((labels == label).sum()) for label in label_set},
        lengths={
            label: (int(lengths[labels == label].min()), int(lengths[labels == label].max()))
            for label in label_set
        },
        strata=strata,
        series=dict(zip(rows.entity[rows.starts].tolist(), labels.tolist(), strict=True)),
        last_times=_last_times(path, table, spec.time_col, rows),
    )


def refuse_nulls(path: Path, table: pa.Table, columns: list[str]) -> None:
    """Refuses a null in any of `columns` of `table` (read from `path`): a null series id
    would become the series `'None'`, a null label the label `'None'`.

    Raises:
        ValueError: `PATH: row N: column 'NAME' is null`, as `metadist ingest` says it.
    """
    for name in columns:
        column = table.column(name)
        if column.null_count:
            row = int(np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"{path}: row {row}: column {name!r} is null")


def finite_values(path: Path, table: pa.Table, value_col: str, remedy: str) -> np.ndarray:
    """`[N]` float64 the values of `table`'s `value_col` (`path`'s), every one a finite
    number (nulls are refused before, by `refuse_nulls`).

    Raises:
        ValueError: a column that is not numbers, or naming the first row that is not
            finite and how many are not, with `remedy`.
    """
    column = table.column(value_col)
    try:
        values = pc.cast(column, "float64").to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ValueError(
            f"{path}: column {value_col!r} (value_col in {SPEC_FILE}) must hold numbers, "
            f"not {column.type}"
        ) from None
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        raise ValueError(
            f"{path}: row {int(bad[0])}: column {value_col!r} is {values[bad[0]]} ({len(bad)} "
            f"such rows); {remedy}"
        )
    return values


def time_steps(path: Path, table: pa.Table, time_col: str) -> np.ndarray:
    """`[N]` the integer time steps of `table`'s `time_col` (no nulls).

    Raises:
        ValueError: a column that is not integer time steps.
    """
    try:  # as the store keeps them: timestamps in epoch nanoseconds, whatever the unit
        times = to_int64_time(table.column(time_col).combine_chunks(), path, 0, time_col)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ValueError(
            f"{path}: column {time_col!r} (time_col in {SPEC_FILE}) must hold integer time "
            f"steps, not {table.schema.field(time_col).type}"
        ) from None
    return np.asarray(times, dtype=np.int64)


def _last_times(path: Path, table: pa.Table, time_col: str, rows: _Rows) -> dict[str, int]:
    """Each series' last time step."""
    times = time_steps(path, table, time_col)[rows.order]
    last = np.maximum.reduceat(times, rows.starts)
    return dict(zip(rows.entity[rows.starts].tolist(), last.tolist(), strict=True))


def _wanted_columns(path: Path, spec: CompetitionSpec) -> dict[str, str]:
    """The columns the scan reads, by setting (`entity_col`, `label_col` and those of
    `stratum_col`, `horizon_col`, `period_col` that are set), each checked to be in the
    file with `time_col` and `value_col`.

    Raises:
        ValueError: a missing column, naming the setting that names it.
    """
    names = open_parquet(path).schema_arrow.names  # a file that is not Parquet: named
    wanted = {"entity_col": spec.entity_col, "label_col": spec.label_col}
    for key in ("stratum_col", "horizon_col", "period_col"):
        value = getattr(spec, key)
        if value is not None:
            wanted[key] = value
    for key in ("entity_col", "label_col", "time_col", "value_col"):
        column = wanted.get(key, getattr(spec, key))
        if column not in names:
            raise ValueError(
                f"{path} has no column {column!r} ({key} in {SPEC_FILE}); its columns: "
                f"{', '.join(names)}"
            )
    for key in ("horizon_col", "period_col", "stratum_col"):
        if key in wanted and wanted[key] not in names:
            kind = key.split("_")[0]
            fallback = f" and give {kind}s: {{LABEL: value}}" if kind != "stratum" else ""
            raise ValueError(
                f"{path} has no column {wanted[key]!r} ({key} in {SPEC_FILE}); set {key}: "
                f"null in {SPEC_FILE}{fallback}"
            )
    return wanted


def _per_series(
    path: Path, table: pa.Table, wanted: dict[str, str], rows: _Rows, key: str
) -> np.ndarray | None:
    """`[S]` the value of the column of setting `key` in each series (integers for the
    horizon and the period, strings otherwise); None where that setting is unset.

    Raises:
        ValueError: a series whose value changes along it.
    """
    if key not in wanted:
        return None
    column = table.column(wanted[key])
    if key in ("horizon_col", "period_col"):
        values = np.asarray(pc.cast(column, "int64").to_numpy(), dtype=np.int64)[rows.order]
    else:
        values = np.asarray(column.to_pylist(), dtype=object).astype(str)[rows.order]
    changes = np.flatnonzero(values[1:] != values[:-1]) + 1
    inside = np.setdiff1d(changes, rows.starts)
    if len(inside):
        series = rows.entity[inside[0]]
        raise ValueError(
            f"{path}: series {series!r} has more than one {wanted[key]!r} value; each "
            "series needs one"
        )
    return values[rows.starts]


def _per_label(
    path: Path,
    spec: CompetitionSpec,
    kind: str,
    values: np.ndarray | None,
    given: dict[str, int],
    labels: np.ndarray,
) -> dict[str, int]:
    """Each label's `kind` (horizon or period): the one value its series share in the
    file (`values`, `[S]`), else the one `competition.yaml` gives (`given`).

    Raises:
        ValueError: series of one label that disagree, a label with no value, a value < 1.
    """
    found: dict[str, int] = {}
    for label in sorted(set(labels.tolist())):
        if values is not None:
            distinct = sorted(set(values[labels == label].tolist()))
            if len(distinct) > 1:
                raise ValueError(
                    f"{path}: the series of {spec.label_col} {label!r} have {kind}s "
                    f"{distinct}; every series of one label needs the same {kind}"
                )
            found[label] = int(distinct[0])
        elif label in given:
            found[label] = int(given[label])
        else:
            raise ValueError(
                f"{kind} of {spec.label_col} {label!r} unknown: {path} has no {kind} column "
                f"and {SPEC_FILE} gives no {kind}s: {{{label}: ...}}"
            )
        if found[label] < 1:
            raise ValueError(
                f"{kind} of {spec.label_col} {label!r} must be >= 1, got {found[label]}"
            )
    return found
