"""Whether the model adapts, per horizon: each run writes which of the adapted and the
unadapted ensemble won by the evaluation's primary metric, the data set's own
(`adaptation.json`); a test run reads a validation run's choice, made on the same metric.

Entries are keyed by group (`members.Group.key`): the horizon `H`, or `H-mP` for the
labels of seasonal period P of a horizon whose labels mix periods."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from metadist.commands.competition.spec import ADAPTATION_FILE
from metadist.durable import atomic_write_text
from metadist.eval.report import EVAL_DIR, JSON_NAME


def write_adaptation_choice(
    out: Path, evaluated: dict[str, Path] | dict[int, Path], validation: bool
) -> dict[str, dict[str, Any]]:
    """`OUT/adaptation.json`: for each group (its evaluated run), the primary metric of
    the adapted and the unadapted forecast and which won (`adapted` only where it is
    strictly better). A learner without an inner loop has no unadapted forecast: there,
    nothing is written for that horizon."""
    decisions: dict[str, dict[str, Any]] = {}
    for horizon, run_dir in evaluated.items():
        result = json.loads((run_dir / EVAL_DIR / JSON_NAME).read_text())
        metric = result["primary_metric"]
        overall = result["overall"]
        if "unadapted" not in overall or "adapted" not in overall:
            continue
        adapted = float(overall["adapted"][metric]["value"])
        unadapted = float(overall["unadapted"][metric]["value"])
        # a figure that is not finite (diverged) never wins
        better = np.isfinite(adapted) and (not np.isfinite(unadapted) or adapted < unadapted)
        decisions[str(horizon)] = {
            "metric": metric,
            "adapted": adapted,
            "unadapted": unadapted,
            "choice": "adapted" if better else "unadapted",
        }
    document = {"protocol": "validation" if validation else "test", "horizons": decisions}
    atomic_write_text(out / ADAPTATION_FILE, json.dumps(document, indent=1) + "\n")
    return decisions


def read_adaptation_choice(
    val_out: Path, horizons: Sequence[str | int], metric: str | None = None
) -> dict[str, str]:
    """Per group key (`horizons`: `H` or `H-mP`), `adapted` or `unadapted`, from a
    validation run's `adaptation.json`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file written by a test run (settings are chosen on validation
            only), not valid, without one of `horizons`, or chosen on another metric
            than `metric` (the data set's).
    """
    path = val_out / ADAPTATION_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no {ADAPTATION_FILE} in {val_out}; run the validation protocol first: "
            f"metadist competition DATA_DIR --validation --out {val_out}"
        )
    try:
        document = json.loads(path.read_text())
        protocol, decisions = document["protocol"], document["horizons"]
        choices = {str(h): str(e["choice"]) for h, e in decisions.items()}
        metrics = {str(e["metric"]) for e in decisions.values() if "metric" in e}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(
            f"{path} is not an adaptation choice written by metadist competition"
        ) from None
    if protocol != "validation":
        raise ValueError(
            f"{path} was written by a {protocol} run; --adaptation-from takes a --validation "
            "run's output (settings are never chosen on the test holdout)"
        )
    keys = [str(h) for h in horizons]
    missing = [h for h in keys if h not in choices]
    if missing:
        raise ValueError(
            f"{path} has no choice for horizon {missing[0]} (it has "
            f"{', '.join(sorted(choices)) or 'none'})"
        )
    bad = [c for c in choices.values() if c not in ("adapted", "unadapted")]
    if bad:
        raise ValueError(f"{path}: choice {bad[0]!r} is neither adapted nor unadapted")
    if metric is not None and metrics - {metric}:
        raise ValueError(
            f"{path} chose by {sorted(metrics)[0]}, this run's primary metric is {metric}: "
            "run the validation protocol again with the same metric"
        )
    return {h: choices[h] for h in keys}
