"""Data sets written as long-format Parquet, ready for `metadist ingest`.

- `metadist.datasets.synthetic`: the synthetic sensor panel (the embedded default data).
- `metadist.datasets.m3`: the 3003 M3 competition series (needs the `datasets` extra).
"""

from metadist.datasets.m3 import (
    M3_CATEGORIES,
    M3_COLUMNS,
    M3_FREQUENCIES,
    M3_HORIZONS,
    M3_INGEST_ARGS,
    M3_PERIODS,
    M3_TEST_FILE,
    M3_TRAIN_FILE,
    MissingExtraError,
    load_m3_series,
    write_m3,
)
from metadist.datasets.synthetic import (
    SYNTHETIC_COLUMNS,
    SYNTHETIC_ENTITY,
    SYNTHETIC_FEATURES,
    SYNTHETIC_INGEST_ARGS,
    SYNTHETIC_LABEL,
    SYNTHETIC_NAN_FEATURES,
    SYNTHETIC_PERIODS,
    SYNTHETIC_STRATA,
    SYNTHETIC_STRATUM,
    SYNTHETIC_TARGET,
    SYNTHETIC_TIME,
    PanelSummary,
    write_synthetic_panel,
)

__all__ = [
    "M3_CATEGORIES",
    "M3_COLUMNS",
    "M3_FREQUENCIES",
    "M3_HORIZONS",
    "M3_INGEST_ARGS",
    "M3_PERIODS",
    "M3_TEST_FILE",
    "M3_TRAIN_FILE",
    "MissingExtraError",
    "PanelSummary",
    "SYNTHETIC_COLUMNS",
    "SYNTHETIC_ENTITY",
    "SYNTHETIC_FEATURES",
    "SYNTHETIC_INGEST_ARGS",
    "SYNTHETIC_LABEL",
    "SYNTHETIC_NAN_FEATURES",
    "SYNTHETIC_PERIODS",
    "SYNTHETIC_STRATA",
    "SYNTHETIC_STRATUM",
    "SYNTHETIC_TARGET",
    "SYNTHETIC_TIME",
    "load_m3_series",
    "write_m3",
    "write_synthetic_panel",
]
