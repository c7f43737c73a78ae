"""The pooled table: the horizons' evaluations combined into one (`OUT/metrics.md`,
`metrics.json`, `tasks.parquet`, `forecasts.parquet`)."""

from __future__ import annotations

import os
from pathlib import Path

from metadist.eval.combine import combine_runs
from metadist.eval.report import write_report


def table_title(
    experiment: str,
    name: str,
    validation: bool,
    num_models: int,
    chosen: bool,
    candidates: tuple[str, ...] = (),
) -> str:
    """The pooled table's title: what was trained on which data set, and how
    (`num_models` per horizon; `candidates`: the losses whose ensembles a validation
    run chose among, per horizon)."""
    title = f"{experiment} on {name}" + (" (validation protocol)" if validation else "")
    if len(candidates) > 1:
        per_loss = num_models // len(candidates)
        title += (
            f": one ensemble per candidate loss ({', '.join(candidates)}) of {per_loss} "
            f"{'model' if per_loss == 1 else 'models'} per horizon; the table shows each "
            "horizon's chosen loss"
        )
    else:
        models = "model" if num_models == 1 else "models"
        title += f": {num_models} {models} per horizon, one ensemble per horizon"
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
