"""Loading a run's parts: from its store, or from its own `inference.json` when the
store is gone (`metadist.train.artifact`).

A run is found where its record says its store is: the store's path relative to the run
directory (a run copied together with its store), its absolute path, or the config's
`data.store` from the working directory; the store must be the one the run recorded.
Where none holds it, the run's record stands in for the store: a moved run forecasts
from any working directory without it. A run loaded from its store gains the record
when it has none, so runs trained before records were kept gain it on first use; a
record there is never rewritten by loading.

A run may also record the seasonal period of the series it was trained on
(`periods.json`, written by `metadist competition` from the data): one integer, or one
per label. It replaces the run's `eval.seasonal_period` when the run is loaded, so that
`Run.forecast` gives Theta and seasonal naive the data's period without `period=`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from metadist.durable import atomic_write_text
from metadist.eval.run import load_trained
from metadist.eval.settings import EvalOptions
from metadist.store.format import check_given_store, is_store
from metadist.train.artifact import (
    INFERENCE_FILE,
    read_inference,
    recorded_source,
    recorded_store_path,
    recorded_store_places,
    write_inference,
)
from metadist.train.build import TaskSource
from metadist.train.config import TrainConfig, store_not_found

Loaded = tuple[Path, TrainConfig, nn.Module, TaskSource, EvalOptions]
# the seasonal period of a run's series: {"seasonal_period": m or {label: m}, "keyed_by"}
PERIODS_FILE = "periods.json"


def write_periods(run_dir: str | os.PathLike, periods: int | dict[str, int]) -> None:
    """Records in `run_dir` the seasonal period of the series it was trained on: one
    integer, or `{label: m}` (written only where it changes).

    Raises:
        ValueError: a period that is not an integer >= 1.
    """
    values = list(periods.values()) if isinstance(periods, dict) else [periods]
    if not values or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in values):
        raise ValueError(f"seasonal periods must be integers >= 1, got {periods!r}")
    document = {"seasonal_period": periods, "keyed_by": "label"}
    path = Path(run_dir) / PERIODS_FILE
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    if not (path.is_file() and path.read_text() == text):
        atomic_write_text(path, text)


def recorded_periods(run_dir: str | os.PathLike) -> int | dict[str, int] | None:
    """The seasonal period `run_dir` records (`write_periods`), or None where it records
    none.

    Raises:
        ValueError: a `periods.json` that is not one `write_periods` writes.
    """
    path = Path(run_dir) / PERIODS_FILE
    if not path.is_file():
        return None
    try:
        periods = json.loads(path.read_text())["seasonal_period"]
        values = list(periods.values()) if isinstance(periods, dict) else [periods]
        valid = values and all(type(m) is int and m >= 1 for m in values)
    except (ValueError, KeyError, TypeError, AttributeError):
        valid = False
    if not valid:
        raise ValueError(f"{path} does not hold seasonal periods as metadist records them")
    return {str(k): int(v) for k, v in periods.items()} if isinstance(periods, dict) else periods


def with_recorded_periods(run_dir: Path, options: EvalOptions) -> EvalOptions:
    """`options` with the seasonal period the run records, where it records one."""
    periods = recorded_periods(run_dir)
    if periods is None:
        return options
    return dataclasses.replace(options, seasonal_period=periods, seasonal_period_from="label")


def load_parts(
    run_dir: str | os.PathLike,
    *,
    ensemble: Sequence[str | os.PathLike] | None,
    store: str | os.PathLike | None,
    allow_imports: Collection[str] = (),
) -> Loaded:
    """`(run_dir, config, learner, task source, eval options)` of a run (see `load_run`).

    Raises:
        FileNotFoundError: no run, no checkpoint, or neither its store nor its record.
        ValueError: a store that does not match the run, a damaged record without the
            store, or ensemble members of another store.
    """
    run_dir = Path(run_dir)
    if store is not None:
        check_given_store(store)
    try:
        record = read_inference(run_dir)
        problem = ""
    except ValueError as error:
        record, problem = None, str(error)
    if store is None and record is not None and record.get("store"):
        found = recorded_store_path(run_dir, record)
        if found is None:
            _note_replaced_stores(run_dir, record)
            path, config, learner, source, options = _from_record(
                run_dir, record, ensemble, allow_imports
            )
            return path, config, learner, source, with_recorded_periods(run_dir, options)
        store = found  # the run's store, wherever data.store leads from here
    try:
        loaded = load_trained(run_dir, ensemble=ensemble, store=store, allow_imports=allow_imports)
    except FileNotFoundError as error:
        if store is not None or not str(error).startswith("data.store"):
            raise
        if problem:  # the record, not the store the config names, is what to fix
            raise FileNotFoundError(
                f"{problem}; without it run_dir {run_dir} needs its store, which is not "
                "where its config's data.store leads: copy the run again, or pass "
                "store=PATH (metadist forecast --store PATH) to load it from its store"
            ) from None
        # A relative data.store is relative to where the run was trained.
        why = f" and has no {INFERENCE_FILE} (a record of it)"
        raise FileNotFoundError(
            f"{store_not_found(error)}; run_dir {run_dir} reads the store its config names "
            f"(relative paths from where it was trained){why}: pass store=PATH (metadist "
            "forecast --store PATH) if it is elsewhere"
        ) from None
    _keep_record(run_dir, record, loaded)
    path, config, learner, source, options = loaded
    return path, config, learner, source, with_recorded_periods(run_dir, options)


def _note_replaced_stores(run_dir: Path, record: dict[str, Any]) -> None:
    """A note for each place the record names that holds a store other than the run's
    (replaced since the training: its data changed), before the record stands in."""
    places = [place.resolve() for place in recorded_store_places(run_dir, record)]
    for place in dict.fromkeys(places):  # one note for one place, however it is named
        if is_store(place):
            print(
                f"note: the store at {place} is not the one run_dir {run_dir} was trained "
                f"on (its data changed since); forecasting from the run's {INFERENCE_FILE}",
                file=sys.stderr,
            )


def _from_record(
    run_dir: Path,
    record: dict[str, Any],
    ensemble: Sequence[str | os.PathLike] | None,
    allow_imports: Collection[str],
) -> Loaded:
    """The run's parts with its recorded source in place of its store."""
    source = recorded_source(run_dir, record)
    # The record stands in for the store; naming the run directory as the store only
    # passes the config's check that data.store is a directory (nothing is read there).
    path, config, learner, source, options = load_trained(
        run_dir, ensemble=ensemble, store=run_dir, source=source, allow_imports=allow_imports
    )
    config.data.store = record["store"]["config_path"]
    if not config.eval and record.get("eval"):
        options = EvalOptions.from_dict(record["eval"])
    members = list(options.ensemble or []) if ensemble is None else list(ensemble)
    for member in members:
        theirs = read_inference(member)
        if theirs is None or not theirs.get("store"):
            raise ValueError(
                f"eval.ensemble: {member} has no {INFERENCE_FILE}, and the store of run_dir "
                f"{run_dir} is not at hand: pass store=PATH (metadist forecast --store PATH)"
            )
        if theirs["store"]["identity"] != record["store"]["identity"]:
            raise ValueError(
                f"eval.ensemble: {member} was trained on another store than run_dir "
                f"{run_dir}; members must see the same tasks"
            )
    return path, config, learner, source, options


def _keep_record(run_dir: Path, record: dict[str, Any] | None, loaded: Loaded) -> None:
    """Writes the run's record where it has none (a note where the run directory cannot
    be written). A record there is left as it is, readable or not: loading a run does not
    change it, wherever the run or its store now are."""
    if record is not None or (run_dir / INFERENCE_FILE).exists():
        return  # a record another version wrote, or a damaged one, stays as it is
    _, config, _, source, options = loaded
    settings = None if config.eval else dataclasses.asdict(options)
    try:
        write_inference(run_dir, config, source, settings)
    except OSError as error:  # the system's reason, not the temporary file it names
        reason = os.strerror(error.errno).lower() if error.errno else str(error)
        print(
            f"note: run_dir {run_dir}: cannot write {INFERENCE_FILE} ({reason}); the run "
            "still needs its store to forecast",
            file=sys.stderr,
        )
