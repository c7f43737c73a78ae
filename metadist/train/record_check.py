"""The fields of a run's `inference.json` that loading a run reads, checked when it is
read (`metadist.train.artifact.read_inference`): a record damaged by hand or by a
half-finished copy is refused in one line naming the field, not met as a `KeyError`
deep in a forecast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metadist.tasks.inference import ATTRIBUTES

SCALING_KINDS = ("global", "per-entity", "none")


def check_record(path: Path, record: dict[str, Any]) -> None:
    """Checks the parts of `record` (read from `path`) that a loaded run reads.

    Raises:
        ValueError: `<path> is damaged: <field> ...`, naming the first field that is
            missing or of the wrong type.
    """
    problem = _problem(record)
    if problem:
        raise ValueError(f"{path} is damaged: {problem}")


def _problem(record: dict[str, Any]) -> str:
    """What is wrong with `record`, or `""`."""
    sampler, shapes = record.get("sampler"), record.get("shapes")
    checks = [
        _mapping(record, "sampler", "sampler"),
        _mapping(sampler, "name", "sampler.name", str),
        _mapping(sampler, "class", "sampler.class", str),
        _mapping(sampler, "attributes", "sampler.attributes", dict),
        _attributes(sampler),
        _mapping(record, "shapes", "shapes"),
        _whole_numbers(shapes, "input_shape", "shapes"),
        _whole_numbers(shapes, "output_shape", "shapes"),
    ]
    if record.get("eval") is not None and not isinstance(record["eval"], dict):
        checks.append("eval is not a mapping")
    if record.get("store") is not None:
        checks.append(_store(record["store"]))
    return next((problem for problem in checks if problem), "")


def _mapping(parent: Any, key: str, field: str, kind: type = dict) -> str:
    """A problem where `parent[key]` is missing or not of `kind` (a dict, by default)."""
    if not isinstance(parent, dict):
        return ""  # the parent's own problem is named first
    if key not in parent:
        return f"{field} is missing"
    if not isinstance(parent[key], kind):
        return f"{field} is {parent[key]!r}, not {'a mapping' if kind is dict else 'text'}"
    return ""


def _whole_numbers(parent: Any, key: str, prefix: str) -> str:
    if not isinstance(parent, dict):
        return ""
    value = parent.get(key)
    if not isinstance(value, list) or not all(_is_int(item) for item in value):
        missing = key not in parent
        return f"{prefix}.{key} is {'missing' if missing else f'{value!r}, not a list of integers'}"
    return ""


def _attributes(sampler: Any) -> str:
    """A problem with the sampler's recorded protocol attributes (integers, lists of
    integers, booleans or null: what `protocol_attributes` writes)."""
    if not isinstance(sampler, dict) or not isinstance(sampler.get("attributes"), dict):
        return ""
    for name, value in sampler["attributes"].items():
        field = f"sampler.attributes.{name}"
        if name not in ATTRIBUTES:
            return f"{field} is not an attribute of the inference protocol"
        if isinstance(value, list):
            if not all(_is_int(item) for item in value):
                return f"{field} is {value!r}, not a list of integers"
        elif value is not None and not isinstance(value, (int, bool)):
            return f"{field} is {value!r}, not an integer"
    return ""


def _store(store: Any) -> str:
    """A problem with the recorded store: where it was, its identity and its metadata."""
    if not isinstance(store, dict):
        return f"store is {store!r}, not a mapping"
    checks = [
        _mapping(store, "path_from_run_dir", "store.path_from_run_dir", str),
        _mapping(store, "path", "store.path", str),
        _mapping(store, "identity", "store.identity"),
        _mapping(store, "metadata", "store.metadata"),
    ]
    if store.get("config_path") is not None and not isinstance(store["config_path"], str):
        checks.append(f"store.config_path is {store['config_path']!r}, not text")
    metadata = store.get("metadata")
    if isinstance(metadata, dict):
        checks.append(_metadata(metadata))
    return next((problem for problem in checks if problem), "")


def _metadata(metadata: dict[str, Any]) -> str:
    """A problem with the recorded part of the store's `metadata.json`."""
    for key in ("feature_names", "target_names", "column_names"):
        names = metadata.get(key)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return f"store.metadata.{key} is {names!r}, not a list of column names"
    for key in ("entity_col", "time_col", "time_kind"):
        if not isinstance(metadata.get(key), str):
            return f"store.metadata.{key} is {metadata.get(key)!r}, not text"
    scaling = metadata.get("scaling")
    if not isinstance(scaling, dict) or scaling.get("kind") not in SCALING_KINDS:
        return f"store.metadata.scaling is {scaling!r}, not one of the kinds {SCALING_KINDS}"
    if scaling["kind"] == "global":
        columns = len(metadata["column_names"])
        for key in ("mean", "std"):
            values = scaling.get(key)
            if (
                not isinstance(values, list)
                or len(values) != columns
                or not all(_is_number(v) for v in values)
            ):
                return (
                    f"store.metadata.scaling.{key} is {values!r}, not {columns} number(s), "
                    "one per column"
                )
    return ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
