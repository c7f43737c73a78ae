"""The synthetic sensor panel: many related series as shuffled, multi-file Parquet.

- `generator`: what the series are (strata, profiles, one entity's series);
- `writer`: `write_synthetic_panel`, dealing chunks of entities to Parquet files;
- its command line, `metadist synth OUT_DIR ...`, is `metadist.commands.synth`.
"""

from metadist.datasets.synthetic.generator import (
    SYNTHETIC_BYTES_PER_ROW,
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
    TIMESTAMP_ORIGIN,
    TIMESTAMP_STEP_NS,
    StratumSpec,
)
from metadist.datasets.synthetic.writer import (
    PanelSummary,
    num_entities_for_size,
    panel_schema,
    write_synthetic_panel,
)

__all__ = [
    "SYNTHETIC_BYTES_PER_ROW",
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
    "TIMESTAMP_ORIGIN",
    "TIMESTAMP_STEP_NS",
    "PanelSummary",
    "StratumSpec",
    "num_entities_for_size",
    "panel_schema",
    "write_synthetic_panel",
]
