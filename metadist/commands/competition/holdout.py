"""The holdout: the test file checked against every series' horizon before anything
runs, or (the validation protocol) cut from the end of each series' training part."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metadist.commands.competition.series import (
    SeriesInfo,
    finite_values,
    refuse_nulls,
    time_steps,
)
from metadist.commands.competition.sources import (
    check_same_source,
    file_fingerprint,
    recorded_fingerprint,
)
from metadist.commands.competition.spec import (
    SOURCE_FILE,
    SPEC_FILE,
    TEST_FILE,
    TRAIN_FILE,
    CompetitionSpec,
    spec_dict,
)
from metadist.commands.competition.steps import step
from metadist.durable import atomic_directory
from metadist.store.sources import open_parquet


def check_holdout(
    path: Path,
    spec: CompetitionSpec,
    info: SeriesInfo,
    horizons: Sequence[int],
    partial: bool,
    continues: bool = True,
) -> None:
    """Checks the holdout file before anything is trained, for everything the
    evaluation would refuse after it: its columns are there, with no nulls or NaN
    values; every series of `horizons` has exactly its horizon's number of holdout values
    (none where `partial`), the steps right after its training part (last + 1, last + 2,
    ...; where `continues`: the validation split's holdout follows whatever steps the
    training part has); every series of the holdout is in the training file, with the
    same label where the holdout has the label column.

    Raises:
        ValueError: naming the first series (or row) that differs and how many do.
    """
    table = _read_holdout(path, spec)
    ids = np.asarray(table.column(spec.entity_col).to_pylist(), dtype=object).astype(str)
    times = time_steps(path, table, spec.time_col)
    order = np.argsort(ids, kind="stable")
    names, starts_at, counts = np.unique(ids[order], return_index=True, return_counts=True)
    found = dict(zip(names.tolist(), counts.tolist(), strict=True))
    unknown = [series for series in found if series not in info.series]
    if unknown:
        raise ValueError(
            f"{path}: series {unknown[0]!r} has holdout values but no training part "
            f"({len(unknown)} such series); every holdout series must be in {spec.train}"
        )
    _check_labels(path, spec, info, ids)
    _check_counts(path, spec, info, horizons, partial, found)
    starts = np.minimum.reduceat(times[order], starts_at)
    for series, start in zip(names.tolist(), starts.tolist(), strict=True):
        last = info.last_times.get(series)
        if last is not None and start <= last:
            raise ValueError(
                f"{path}: series {series!r} has holdout values from {spec.time_col} {start}, "
                f"not after its training part (last {spec.time_col} {last}); the holdout "
                "would overlap the data used for adaptation"
            )
    if continues:
        _check_continues(path, spec, info, ids, times)


def _check_labels(path: Path, spec: CompetitionSpec, info: SeriesInfo, ids: np.ndarray) -> None:
    """Where the holdout has the label column, each row's label (`ids`: `[N]` its
    series) is its series' label in the training file (nulls aside): the horizon,
    period and scores are the training label's, so another one means mismatched files.

    Raises:
        ValueError: naming the first series whose labels differ and how many do.
    """
    if spec.label_col not in open_parquet(path).schema_arrow.names:
        return
    column = pq.read_table(path, columns=[spec.label_col]).column(spec.label_col)
    labels = column.to_pylist()
    wrong = {
        str(series): str(label)
        for series, label in zip(ids.tolist(), labels, strict=True)
        if label is not None and str(label) != info.series[str(series)]
    }
    if wrong:
        series, label = next(iter(wrong.items()))
        raise ValueError(
            f"{path}: series {series!r} has {spec.label_col} {label!r} there but "
            f"{info.series[series]!r} in {spec.train} ({len(wrong)} series differ); each "
            "holdout series needs its training part's label"
        )


def _check_continues(
    path: Path, spec: CompetitionSpec, info: SeriesInfo, ids: np.ndarray, times: np.ndarray
) -> None:
    """Each series' holdout times (`ids`, `times`: `[N]`, one per row) are the steps
    right after its training part, without a gap or a repeated step: the evaluation
    scores the holdout as the h steps that follow the history.

    Raises:
        ValueError: naming the first series that does not and how many do not.
    """
    order = np.lexsort((times, ids))
    ids, times = ids[order], times[order]
    starts = np.r_[0, np.flatnonzero(ids[1:] != ids[:-1]) + 1]
    rank = np.arange(len(ids)) - np.repeat(starts, np.diff(np.r_[starts, len(ids)]))
    last = np.array([info.last_times.get(str(series), 0) for series in ids], dtype=np.int64)
    wrong = ids[times != last + 1 + rank]
    if len(wrong):
        series = str(wrong[0])
        found = times[ids == series].tolist()
        expected = info.last_times[series] + 1
        raise ValueError(
            f"{path}: series {series!r} has holdout {spec.time_col} {_steps(found)}, not "
            f"{_steps(list(range(expected, expected + len(found))))} "
            f"({len(set(wrong.tolist()))} of {len(set(ids.tolist()))} series differ); each "
            "holdout continues its series' "
            f"steps after its training part (last {spec.time_col} {expected - 1})"
        )


def _steps(steps: list[int]) -> str:
    """`[1, 2, 3]` as `1..3`, others listed (the first 6)."""
    if steps == list(range(steps[0], steps[0] + len(steps))):
        return f"{steps[0]}..{steps[-1]}"
    shown = ", ".join(map(str, steps[:6]))
    return shown + (", ..." if len(steps) > 6 else "")


def _read_holdout(path: Path, spec: CompetitionSpec) -> pa.Table:
    """The holdout's series id, time and value columns, checked: all there, at least
    one row, no nulls, numeric values and no NaN.

    Raises:
        ValueError: naming the missing column (and its setting) or the first bad row.
    """
    names = open_parquet(path).schema_arrow.names  # a file that is not Parquet: named
    for key in ("entity_col", "time_col", "value_col"):
        column = getattr(spec, key)
        if column not in names:
            raise ValueError(
                f"{path} has no column {column!r} ({key} in {SPEC_FILE}); its "
                f"columns: {', '.join(names)}"
            )
    columns = list(dict.fromkeys([spec.entity_col, spec.time_col, spec.value_col]))
    table = pq.read_table(path, columns=columns)
    if table.num_rows == 0:
        raise ValueError(f"{path} has no rows; the holdout needs each series' next values")
    refuse_nulls(path, table, columns)
    finite_values(path, table, spec.value_col, "a holdout value must be a finite number")
    return table


def _check_counts(
    path: Path,
    spec: CompetitionSpec,
    info: SeriesInfo,
    horizons: Sequence[int],
    partial: bool,
    found: dict[str, int],
) -> None:
    """Every series of `horizons` has its horizon's number of holdout values in `found`
    (or none, where `partial`).

    Raises:
        ValueError: naming the first series that differs and how many do.
    """
    wanted = set(horizons)
    wrong = []
    for series, label in info.series.items():
        horizon = info.horizons[label]
        if horizon not in wanted:
            continue
        count = found.get(series, 0)
        if count != horizon and not (partial and count == 0):
            wrong.append((series, label, horizon, count))
    if wrong:
        total = sum(info.horizons[label] in wanted for label in info.series.values())
        series, label, horizon, count = wrong[0]
        fix = "" if count else "; or set eval.holdout.partial=true to score only the others"
        raise ValueError(
            f"{path}: series {series!r} ({spec.label_col} {label}, horizon {horizon}) has "
            f"{count} holdout values, not {horizon} ({len(wrong)} of "
            f"{total} series differ); "
            f"each series needs its horizon's number of holdout values{fix}"
        )


def write_validation_split(
    data_dir: Path, spec: CompetitionSpec, info: SeriesInfo, out: Path
) -> None:
    """`out/train.parquet` and `out/test.parquet`: each series' training part without its
    last h values, and those h values (h its label's horizon). Series with no more than
    h training values are left out of both, with a note. Written atomically."""
    path = data_dir / spec.train
    table = pq.read_table(path)
    refuse_nulls(path, table, [spec.entity_col, spec.time_col, spec.label_col])
    entity = np.asarray(table.column(spec.entity_col).to_pylist(), dtype=object).astype(str)
    times = time_steps(path, table, spec.time_col)
    labels = np.asarray(table.column(spec.label_col).to_pylist(), dtype=object).astype(str)
    order = np.lexsort((times, entity))
    table, entity, labels = table.take(pa.array(order)), entity[order], labels[order]
    starts = np.r_[0, np.flatnonzero(entity[1:] != entity[:-1]) + 1]
    ends = np.r_[starts[1:], len(entity)]
    is_test = np.zeros(len(entity), dtype=bool)
    keep = np.ones(len(entity), dtype=bool)
    dropped = 0
    for start, end in zip(starts, ends, strict=True):
        h = info.horizons[labels[start]]
        if end - start <= h:
            keep[start:end] = False
            dropped += 1
        else:
            is_test[end - h : end] = True
    with atomic_directory(out) as staging:
        pq.write_table(table.filter(pa.array(keep & ~is_test)), staging / TRAIN_FILE)
        pq.write_table(table.filter(pa.array(keep & is_test)), staging / TEST_FILE)
        spec_values = {
            k: v for k, v in spec_dict(spec).items() if k not in ("train", "test", "references")
        }
        (staging / SPEC_FILE).write_text(json.dumps(spec_values, indent=1) + "\n")
        source = {"fingerprint": file_fingerprint(data_dir / spec.train)}
        (staging / SOURCE_FILE).write_text(json.dumps(source) + "\n")
    if dropped:
        print(f"note: validation split: {dropped} series no longer than their horizon left out")


def validation_split(
    source_dir: Path, spec: CompetitionSpec, info: SeriesInfo, split: Path, out: Path, title: str
) -> None:
    """`split`: the validation split of `source_dir`'s training file, written (a step
    announced as `title`), or confirmed made from that file as it is now.

    Raises:
        ValueError: an existing split not made from the training file as it is now, or
            not recording which file it was made from (naming `out`).
    """
    source = source_dir / spec.train
    if (split / TRAIN_FILE).is_file():
        check_same_source(split, recorded_fingerprint(split / SOURCE_FILE), source, out)
    else:
        step(title, lambda: write_validation_split(source_dir, spec, info, split))
