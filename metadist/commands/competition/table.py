"""The pooled table: the horizons' evaluations combined into one (`OUT/metrics.md`,
`metrics.json`, `tasks.parquet`, `forecasts.parquet`)."""

from __future__ import annotations

import os
from pathlib import Path

from metadist.eval.combine import combine_runs
from metadist.eval.report import write_report


def table_title(experiment: str, name: str, validation: bool, num_models: int, chosen: bool) -> str:
    """The pooled table's title: what was trained on which data set, and how."""
    title = f"{experiment} on {name}" + (" (validation protocol)" if validation else "")
    title += f": {num_models} model(s) per horizon, one ensemble per horizon"
    if chosen:
        title += "; adaptation per horizon as chosen on validation"
    return title


def pooled_table(
    firsts: list[Path], out: Path, title: str, chosen: list[str] | None = None
) -> Path:
    """Writes the pooled table of the evaluated runs `firsts` (one per horizon, with
    each one's `chosen` method, if given) into `out`; returns its `metrics.md`."""
    # one horizon too: the same table, title and references as several
    result = combine_runs(list[str | os.PathLike](firsts), title=title, chosen=chosen)
    write_report(result, out, directory=out)
    return out / "metrics.md"
