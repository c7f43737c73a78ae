"""`metadist competition DATA_DIR`: the forecasting-competition protocol on any data set.

DATA_DIR holds two long-format Parquet files: `train.parquet` (each series' in-sample
part) and `test.parquet` (each series' holdout, its next h values). What the protocol
needs to know of a series comes from the data: its forecast horizon and seasonal period
from the columns `horizon` and `period` (as `metadist datasets` writes them), or from
per-label maps in `DATA_DIR/competition.yaml`, which also names other columns and the
published references of that data set (see `CompetitionSpec`). One command then runs:

1. ingest `train.parquet` into `OUT/store` (raw values; the holdout is never ingested),
   with the training series of `--train-with` sets beside it, renamed, never scored;
2. for every horizon H of the data set, meta-train `experiment` (default `competition`)
   on the training parts of **all** series, as tasks of lookback L and horizon H: one
   run per ensemble member (each lookback multiple × loss × seed), `--jobs` at a time;
3. evaluate each horizon's ensemble on the series of that horizon (their labels),
   forecasting the holdout, next to the baselines;
4. pool the horizons into one table: `OUT/metrics.md`, `metrics.json`, `tasks.parquet`
   (per series) and `forecasts.parquet` (every forecast point of every method).

With `--validation` the same protocol runs one horizon earlier, on the training parts
alone (each series' last h training values become the holdout; `test.parquet` is not
read): settings are chosen there, never on the test holdout. Every run writes
`OUT/adaptation.json`: per horizon, the primary metric of the adapted and the unadapted
ensemble and which won. `--adaptation-from VAL_OUT` reads a validation run's file and
adds the column the competition reports as the model alone: per horizon, the adapted
forecast where adaptation won on validation, the unadapted one where it did not.

A recipe with candidate losses (`--recipe cpu`: the data set's metric and sMAPE;
`--loss-candidates`) trains one ensemble per candidate under `--validation` and keeps,
per group, the loss scoring best by the data set's metric there, with the weight of the
model against seasonal naive learned on the same forecasts (`OUT/choices.json`, printed);
shorter trainings (`--step-candidates`) and other starts of the output layer
(`--head-candidates`) are candidates beside the loss (`candidates.py`). A test run with
`--adaptation-from VAL_OUT` trains the chosen candidate alone and reports the model shrunk
by that weight beside the model alone (`OUT/guarded.md`).

The ingest, the validation split and finished training runs are confirmed, not redone,
so an interrupted pipeline resumes where it stopped; each evaluation is read back where
its inputs and reports are unchanged (`reuse`; `--evaluate-again` to force), and the
pooled table is redone on every call.

One idea per module: `spec` (competition.yaml), `series` (the scan of the training file),
`holdout` (the holdout's checks, the validation split), `sources` (which training file an
output was made from), `output` (where it may write), `panels` (other sets trained with,
and the store's ingest), `members` (each horizon's ensemble
and its training), `candidates` (what a validation run chooses among), `switch` (whether
another experiment wins clearly), `evaluation` (each horizon's evaluation), `reuse` (an
evaluation of the same inputs read back), `adaptation` (adapted or not, per horizon), `table` (the pooled
table), `plan` (what a call runs on, checked before any work), `pipeline` (the steps in
order) and `cli` (the command line).
"""

from metadist.commands.competition.adaptation import (
    read_adaptation_choice,
    write_adaptation_choice,
)
from metadist.commands.competition.cli import build_parser, main
from metadist.commands.competition.evaluation import evaluate_horizons, evaluation_overrides
from metadist.commands.competition.holdout import check_holdout, write_validation_split
from metadist.commands.competition.members import (
    Member,
    members_of,
    run_parallel,
    train_members,
    training_overrides,
)
from metadist.commands.competition.pipeline import run_pipeline
from metadist.commands.competition.plan import Plan, plan_run
from metadist.commands.competition.series import SeriesInfo, scan_series
from metadist.commands.competition.sources import (
    check_same_source,
    file_fingerprint,
    recorded_fingerprint,
)
from metadist.commands.competition.spec import (
    ADAPTATION_FILE,
    SOURCE_FILE,
    SPEC_FILE,
    TEST_FILE,
    TRAIN_FILE,
    CompetitionSpec,
    load_spec,
)
from metadist.commands.competition.table import pooled_table

__all__ = [
    "ADAPTATION_FILE",
    "SOURCE_FILE",
    "SPEC_FILE",
    "TEST_FILE",
    "TRAIN_FILE",
    "CompetitionSpec",
    "Member",
    "Plan",
    "SeriesInfo",
    "build_parser",
    "check_holdout",
    "check_same_source",
    "evaluate_horizons",
    "evaluation_overrides",
    "file_fingerprint",
    "load_spec",
    "main",
    "members_of",
    "plan_run",
    "pooled_table",
    "read_adaptation_choice",
    "recorded_fingerprint",
    "run_parallel",
    "run_pipeline",
    "scan_series",
    "train_members",
    "training_overrides",
    "write_adaptation_choice",
    "write_validation_split",
]
