"""A run directory that carries what inference needs: `<run_dir>/inference.json`.

Forecasting a new entity reads little of the store a run was trained on: its column
names, entity and time columns, NaN rule and scaling rule (the global statistics, or
per-entity scaling, whose statistics come from the entity's own history), plus the
windows of the run's sampler (`metadist.tasks.inference`) and the model's shapes. A run
records them in `inference.json`, with the store's identity and its path relative to the
run directory, so that a run copied or moved elsewhere, its store deleted, still
forecasts (`metadist.load_run`); the store is then needed only to evaluate the run on
its held-out split.

Training writes the file (`write_inference`), and `load_run` writes it for a run that
lacks it whenever the store is at hand, so older runs gain it on first use.
`recorded_source` rebuilds from it the `TaskSource` that stands in for the store.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import numpy as np

from metadist.durable import atomic_write_text
from metadist.store.format import is_store
from metadist.store.identity import store_identity
from metadist.store.reader import SeriesStore
from metadist.store.scaler import Scaler
from metadist.store.schema import StoreColumns
from metadist.tasks.inference import protocol_attributes
from metadist.train.build import TaskSource
from metadist.train.config import TrainConfig
from metadist.train.record_check import check_record

INFERENCE_FILE = "inference.json"
FORMAT_NAME = "metadist-run-inference"
FORMAT_VERSION = 1
# the store metadata a forecast reads (`metadist.api.history`)
STORE_KEYS = (
    "feature_names",
    "target_names",
    "column_names",
    "entity_col",
    "time_col",
    "time_kind",
    "stratum_col",
    "label_col",
    "nan_policy",
)


def inference_record(
    run_dir: str | os.PathLike,
    config: TrainConfig,
    source: Any,
    eval_settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What `inference.json` holds for a run (JSON values only).

    Args:
        run_dir: the run directory (the store's path is recorded relative to it too).
        config: the run's config.
        source: its built parts: a `TaskSource`, or the `RunParts` of training (anything
            with `store`, `store_identity`, `sampler`, `input_shape`, `output_shape`).
        eval_settings: the evaluation settings to record (default: the config's `eval`).
    """
    store = source.store
    recorded_store = None
    if store is not None:
        location = Path(store.path).resolve()
        scaling = store.metadata["scaling"]
        metadata = {key: store.metadata.get(key) for key in STORE_KEYS}
        metadata["scaling"] = {"kind": scaling["kind"]}
        if scaling["kind"] == "global":
            metadata["scaling"].update(mean=list(scaling["mean"]), std=list(scaling["std"]))
        recorded_store = {
            "path_from_run_dir": os.path.relpath(location, Path(run_dir).resolve()),
            "path": str(location),
            "config_path": config.data.store,
            "identity": source.store_identity,
            "metadata": metadata,
        }
    record = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "store": recorded_store,
        "sampler": {
            "name": config.sampler.name,
            "class": type(source.sampler).__name__,
            "attributes": protocol_attributes(source.sampler),
        },
        "shapes": {
            "input_shape": list(source.input_shape),
            "output_shape": list(source.output_shape),
        },
        "eval": dict(config.eval) if eval_settings is None else eval_settings,
    }
    return json.loads(json.dumps(record))  # plain JSON values, as read back


def write_inference(
    run_dir: str | os.PathLike,
    config: TrainConfig,
    source: Any,
    eval_settings: dict[str, Any] | None = None,
) -> Path:
    """Writes `<run_dir>/inference.json` atomically, creating the run directory (see
    `inference_record` for the arguments), and returns its path.

    Raises:
        OSError: the run directory cannot be written.
    """
    path = Path(run_dir) / INFERENCE_FILE
    record = inference_record(run_dir, config, source, eval_settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return path


def read_inference(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run's `inference.json`, or `None` where it has none.

    Raises:
        ValueError: a file that is not valid JSON, not a run's inference record, of a
            newer format, or damaged (a field missing or of the wrong type), naming the
            file (and the field).
    """
    path = Path(run_dir) / INFERENCE_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT_NAME:
        raise ValueError(f"{path} is not a run's inference record (format {FORMAT_NAME!r})")
    if record.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format version {record.get('format_version')!r}; this metadist reads "
            f"version {FORMAT_VERSION}"
        )
    check_record(path, record)
    return record


def recorded_store_path(run_dir: str | os.PathLike, record: dict[str, Any]) -> Path | None:
    """Where the store of the record is now, if anywhere: its path relative to the run
    directory (a run moved together with its store), its absolute path, or the config's
    `data.store` from the working directory, whichever holds the store the run recorded
    (same identity). `None` where none does."""
    recorded = record.get("store")
    if not recorded:
        return None
    candidates = recorded_store_places(run_dir, record)
    candidates += [Path(recorded["config_path"])] if recorded.get("config_path") else []
    for candidate in dict.fromkeys(candidates):
        if is_store(candidate) and _identity_of(candidate) == recorded["identity"]:
            return candidate
    return None


def recorded_store_places(run_dir: str | os.PathLike, record: dict[str, Any]) -> list[Path]:
    """Where the record puts the run's store: relative to the run directory (moved
    together; through a link to the run directory, also relative to where it points),
    and its absolute path at training."""
    recorded = record["store"]
    relative = recorded["path_from_run_dir"]
    places = [Path(os.path.normpath(Path(run_dir) / relative))]
    places += [Path(os.path.normpath(Path(run_dir).resolve() / relative)), Path(recorded["path"])]
    return list(dict.fromkeys(places))


def current_store(run_dir: str | os.PathLike) -> Path | None:
    """Where the store a run recorded is now (`recorded_store_path`), or `None`: the run
    has no readable record of it, or no copy of it is where the record says."""
    try:
        record = read_inference(run_dir)
    except ValueError:
        return None
    return None if record is None else recorded_store_path(run_dir, record)


def _identity_of(path: Path) -> dict[str, Any] | None:
    try:
        return store_identity(SeriesStore.open(path))
    except (OSError, ValueError):
        return None


class RecordedStore(StoreColumns):
    """What a forecast reads of a run's store (schema, NaN rule, scaling rule), as the
    run recorded it: stands in for a `SeriesStore` that is no longer there.

    Attributes:
        path: the record it comes from (`<run_dir>/inference.json`), for messages.
        metadata: the recorded part of the store's `metadata.json`.
    """

    def __init__(self, path: Path, metadata: dict[str, Any]) -> None:
        self.path = path
        self.metadata = metadata

    def __repr__(self) -> str:
        return f"RecordedStore({str(self.path)!r})"

    def column_index(self, names: str | list[str]) -> list[int]:
        """Column positions of `names` (`ValueError` for a name the store lacks)."""
        names = [names] if isinstance(names, str) else list(names)
        unknown = [name for name in names if name not in self.column_names]
        if unknown:
            raise ValueError(
                f"the run's store has no columns {unknown}; it has {self.column_names}"
            )
        return [self.column_names.index(name) for name in names]

    @cached_property
    def scaler(self) -> Scaler:
        """The store's scaling rule: global statistics, none, or per entity (whose
        statistics a forecast computes from each entity's own history)."""
        scaling = self.metadata["scaling"]
        kind, num = scaling["kind"], self.num_columns
        if kind == "global":
            return Scaler(kind, np.asarray(scaling["mean"]), np.asarray(scaling["std"]))
        if kind == "per-entity":
            return Scaler(kind, np.zeros((0, num)), np.ones((0, num)))
        return Scaler(kind, np.zeros(num), np.ones(num))


class RecordedSampler:
    """A run's sampler as recorded: its name and the attributes of the inference
    protocol it has (`metadist.tasks.inference`), nothing that draws tasks."""

    def __init__(self, name: str, recorded_class: str, attributes: dict[str, Any]) -> None:
        self.name = name
        self.recorded_class = recorded_class
        for key, value in attributes.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        return f"RecordedSampler({self.name!r}, {self.recorded_class})"


def recorded_source(run_dir: str | os.PathLike, record: dict[str, Any]) -> TaskSource:
    """The `TaskSource` of a run whose store is gone, from its `inference.json`: a
    `RecordedStore`, a `RecordedSampler`, no partitioner, and the recorded shapes."""
    recorded = record.get("store")
    path = Path(run_dir) / INFERENCE_FILE
    sampler = record["sampler"]
    shapes = record["shapes"]
    # Stand-ins that serve inference only (the schema, the sampler's recorded
    # attributes); evaluation, which needs the real store and split, never gets them.
    return TaskSource(
        store=cast(Any, None if not recorded else RecordedStore(path, recorded["metadata"])),
        store_identity=None if not recorded else recorded["identity"],
        sampler=cast(
            Any, RecordedSampler(sampler["name"], sampler["class"], sampler["attributes"])
        ),
        partitioner=cast(Any, None),
        input_shape=tuple(shapes["input_shape"]),
        # what evaluation's from-scratch baseline reads, which a recorded source never
        # serves (evaluation needs the store): the model's output shape stands in
        task_output_shape=tuple(shapes["output_shape"]),
        output_shape=tuple(shapes["output_shape"]),
    )
