"""What a competition data set is: `DATA_DIR/competition.yaml` and the file names."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from metadist.eval.settings import FORECAST_METRICS
from metadist.options import from_mapping

TRAIN_FILE = "train.parquet"
TEST_FILE = "test.parquet"
SPEC_FILE = "competition.yaml"
ADAPTATION_FILE = "adaptation.json"
# in a validation split: the fingerprint of the training file it was cut from
SOURCE_FILE = "source.json"
# under the validation protocol: OUT/validation_data holds the split
VALIDATION_DIR = "validation_data"
# where a run goes without --out: runs/NAME
RUNS_DIR = Path("runs")
# a name that can be one directory under runs/: a word of letters, digits, _ . + -,
# not starting with . or - (never "..", a path, or empty)
_PLAIN_NAME = re.compile(r"\w[\w.+-]*")


@dataclass
class CompetitionSpec:
    """What a competition data set is (`DATA_DIR/competition.yaml`; every key optional).

    Attributes:
        name: the data set's name, in the table's title (default: the directory's name);
            without `--out`, the output goes to `runs/NAME`, so it must be a plain word.
        train, test: the two files, relative to DATA_DIR.
        entity_col, time_col, value_col: series id, integer time step, value.
        label_col: the frequency (or any) label of each series; the tables group by it,
            and every series of one label must share one horizon and one period.
        stratum_col: the category of each series (null: none); the tables group by it,
            and the meta-train/meta-val split is stratified by it.
        horizon_col, period_col: per-row columns holding each series' horizon and
            seasonal period (null: use `horizons` / `periods`).
        horizons, periods: `{label: value}`, for data without those columns.
        references: published figures of this data set, shown next to the primary
            metric: `{method: {all: x, label: {LABEL: x}}}`.
        group_names: what labels and strata are called in the tables.
        metric: the data set's own accuracy metric (`smape`, `mape`, `mase`, `mae` or
            `mse`; tourism: `mape`, M1/M3: `smape`): the evaluation's primary metric, the
            training loss where a loss of that name exists (`metadist.learners.LOSSES`),
            the meta-val selection criterion with it, and what the adaptation choice
            compares.
    """

    name: str | None = None
    train: str = TRAIN_FILE
    test: str = TEST_FILE
    entity_col: str = "series_id"
    time_col: str = "t"
    value_col: str = "value"
    label_col: str = "frequency"
    stratum_col: str | None = "category"
    horizon_col: str | None = "horizon"
    period_col: str | None = "period"
    horizons: dict[str, int] = field(default_factory=dict)
    periods: dict[str, int] = field(default_factory=dict)
    references: dict[str, Any] = field(default_factory=dict)
    group_names: dict[str, str] = field(default_factory=dict)
    metric: str = "smape"


def load_spec(data_dir: Path) -> CompetitionSpec:
    """`DATA_DIR/competition.yaml` read (defaults where it is absent).

    Raises:
        ValueError: an unknown key (naming the closest) or a value of the wrong type
            (a horizon or period that is not an integer included).
    """
    path = data_dir / SPEC_FILE
    values: dict[str, Any] = {}
    if path.is_file():
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception as error:  # a YAML syntax error, named with its file
            raise ValueError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path} must hold a mapping of settings")
        values = {str(k): v for k, v in (loaded or {}).items()}
    spec = from_mapping(CompetitionSpec, values, str(path))
    for key in ("horizons", "periods"):  # from_mapping checks a mapping, not its values
        for label, value in getattr(spec, key).items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{path}.{key}.{label} must be an integer, got {value!r}")
    if spec.metric not in FORECAST_METRICS:
        raise ValueError(
            f"{path}: metric must be one of {', '.join(FORECAST_METRICS)}, got {spec.metric!r}"
        )
    return spec


def spec_dict(spec: CompetitionSpec) -> dict[str, Any]:
    """Every setting of `spec`, as a plain dict."""
    return asdict(spec)


def plain_name(name: str) -> bool:
    """Whether `name` can be one directory's name: a plain word of at most 200 bytes."""
    return bool(_PLAIN_NAME.fullmatch(name)) and len(name.encode()) <= 200


def default_output(spec: CompetitionSpec, data_dir: Path, suffix: str = "") -> Path:
    """`runs/NAME` (+ `suffix`), NAME the spec's name or the data directory's, confined
    to one directory under `runs/`.

    Raises:
        ValueError: a name in competition.yaml that is not a plain word (a path, `..`,
            an absolute path), or a directory name that leaves no directory under `runs/`.
    """
    name = spec.name if spec.name is not None else data_dir.resolve().name
    if spec.name is not None and not plain_name(spec.name):
        raise ValueError(
            f"name {spec.name!r} in {data_dir / SPEC_FILE} cannot name the output directory "
            f"{RUNS_DIR}/NAME: use a plain word (letters, digits, _ . + -, not starting with "
            ". or -), or give --out"
        )
    out = RUNS_DIR / (name + suffix)
    if Path(os.path.abspath(out)).parent != Path(os.path.abspath(RUNS_DIR)):
        raise ValueError(
            f"the data directory's name {name!r} does not name a directory under "
            f"{RUNS_DIR}/; give --out"
        )
    return out
