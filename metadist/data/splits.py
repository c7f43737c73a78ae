"""The meta-split of a run: which units are meta-train, meta-val and meta-test.

Two protocols (`data.split_by`):

- **by unit or entity** (`unit`, the default, or `entity`): units (or whole entities, when
  a sampler has several units per entity) are dealt to the splits, stratified by
  `data.stratify_by` (`stratum`, `label` or `none`). Every class may appear in every
  split: the model is scored on *new series* of classes it has seen. This is the
  protocol for forecasting across entities.
- **by class** (`label` or `stratum`): whole classes go to one split each, so meta-train,
  meta-val and meta-test hold *disjoint classes*, as the standard few-shot benchmark
  protocol (Omniglot, miniImageNet) requires: the model is scored on classes it has never
  seen. Fractions are over classes; every split with a positive share gets at least one.
- **auto**: by label when the store's labels are enough for it (every split with a positive
  share gets at least 2 label classes: an episode needs two ways), else by unit,
  stratified by label (every split holds every class: the model is then scored on *new
  cases of classes it has seen*). The shipped UCR recipes use it, so a set of 3 classes
  trains too; `split_protocol` says which protocol a run got, and the evaluation's
  settings (`describe_split`) name it with the classes of every split.

Training, evaluation and sweeps all build the split here, so they agree by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from metadist.data.meta_split import split_counts
from metadist.data.partition import StratifiedTaskPartitioner
from metadist.natural_order import natural_key
from metadist.tasks.units import checked_unit_entities, checked_unit_strata

SPLIT_BY = ("unit", "entity", "label", "stratum", "auto")
# Fewest label classes every split with a positive share needs for `auto` to split by class.
AUTO_MIN_CLASSES = 2
STRATIFY_BY = ("stratum", "label", "none")


def build_partitioner(
    sampler: Any,
    store: Any = None,
    *,
    seed: int,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    split_by: str = "unit",
    stratify_by: str = "stratum",
    pinned_test_units: Sequence[int] | np.ndarray | None = None,
) -> StratifiedTaskPartitioner:
    """The `StratifiedTaskPartitioner` of `sampler`'s units under a split protocol.

    Args:
        sampler: the run's `TaskSampler`.
        store: the store it reads (needed for `label`/`stratum` splits and
            `stratify_by=label`).
        seed: the split's seed.
        fractions: (train, val, test) shares of units, entities or classes.
        split_by: `unit`, `entity`, `label`, `stratum` or `auto` (see the module docstring).
        stratify_by: what unit and entity splits are stratified by (`auto`'s unit split
            is stratified by label whatever it says).
        pinned_test_units: units always in meta-test (with a class split, their whole
            classes are).

    Raises:
        ValueError: a bad protocol name, a protocol the sampler or store cannot serve, or
            too few units/classes for the fractions (named by the `data.*` field).
    """
    if split_by not in SPLIT_BY:
        raise ValueError(f"data.split_by must be one of {', '.join(SPLIT_BY)}, got {split_by!r}")
    if stratify_by not in STRATIFY_BY:
        raise ValueError(
            f"data.stratify_by must be one of {', '.join(STRATIFY_BY)}, got {stratify_by!r}"
        )
    strata = checked_unit_strata(sampler)
    entities = checked_unit_entities(sampler, store)
    if split_by == "auto":
        split_by = split_protocol(sampler, store, fractions, split_by)
        stratify_by = "label"
    if entities is None and (split_by != "unit" or stratify_by == "label"):
        what = f"data.split_by={split_by}" if split_by != "unit" else "data.stratify_by=label"
        raise ValueError(
            f"{what} needs a sampler whose units are store entities; {sampler.name!r} has "
            "none (use data.split_by=unit)"
        )
    groups = split_strata = None
    if split_by in ("label", "stratum"):
        groups = _entity_codes(store, split_by, f"data.split_by={split_by}")[entities]
        split_strata = np.zeros(len(strata), dtype=np.int64)
        counted = "classes"
    else:
        if split_by == "entity":
            groups = entities
        if stratify_by == "label":
            split_strata = _entity_codes(store, "label", "data.stratify_by=label")[entities]
        elif stratify_by == "none":
            split_strata = np.zeros(len(strata), dtype=np.int64)
        counted = "entities" if split_by == "entity" else "units"
    try:
        return StratifiedTaskPartitioner(
            strata,
            seed=seed,
            fractions=tuple(fractions),
            pinned_test_units=pinned_test_units,
            unit_groups=groups,
            split_strata=split_strata,
        )
    except ValueError as error:
        if groups is not None and split_by in ("label", "stratum"):
            num_classes = len(np.unique(groups))
            raise ValueError(
                f"data.split_by={split_by}: {num_classes} {split_by} classes cannot be split by "
                f"data.fractions={list(fractions)} ({error}); every split with a positive "
                "share needs at least one class"
            ) from None
        raise ValueError(f"data.fractions / data.pinned_test_units ({counted}): {error}") from None


def split_protocol(
    sampler: Any, store: Any, fractions: Sequence[float], split_by: str | None
) -> str:
    """The protocol `split_by` gives `sampler`'s units: `auto` resolved to `label` or
    `unit` (see the module docstring), any other name (null: `unit`) as it is.

    Raises:
        ValueError: `auto` without store entities or a label column.
    """
    if split_by != "auto":
        return split_by or "unit"
    entities = checked_unit_entities(sampler, store)
    if entities is None:
        raise ValueError(
            f"data.split_by=auto needs a sampler whose units are store entities; "
            f"{sampler.name!r} has none (use data.split_by=unit)"
        )
    codes = _entity_codes(store, "label", "data.split_by=auto")[entities]
    num_classes = len(np.unique(codes))
    train, val, test = (float(f) for f in fractions)
    positive = [f > 0 for f in (train, val, test)]
    if num_classes < AUTO_MIN_CLASSES * sum(positive):
        return "unit"
    counts = split_counts(num_classes, (train, val, test), 0)
    enough = all(c >= AUTO_MIN_CLASSES for c, p in zip(counts, positive, strict=True) if p)
    return "label" if enough else "unit"


_PROTOCOL_NAMES = {
    "label": "by label class: meta-train, meta-val and meta-test hold disjoint classes",
    "stratum": "by stratum class: meta-train, meta-val and meta-test hold disjoint classes",
    "unit": "by unit: every split may hold every class (scored on new cases of seen classes)",
    "entity": "by entity: every split may hold every class (scored on new entities)",
}


def describe_split(sampler: Any, store: Any, partitioner: Any, data: Any) -> dict[str, Any]:
    """What the report says about a classification run's meta-split: `{"split protocol":
    ..., "classes": {split: class names}}`, and `"model selection": "off: ..."` where
    meta-val has no share; `{}` for samplers without classes (`unit_classes` and
    `class_names`, as `nway_kshot` has). `data` is the run's `DataConfig`."""
    unit_classes = getattr(sampler, "unit_classes", None)
    names = getattr(sampler, "class_names", None)
    if not callable(unit_classes) or names is None:
        return {}
    protocol = split_protocol(sampler, store, data.fractions, data.split_by)
    name = _PROTOCOL_NAMES[protocol]
    out: dict[str, Any] = {"split protocol": f"auto, {name}" if data.split_by == "auto" else name}
    codes = split_classes(partitioner, unit_classes())
    out["classes"] = {  # numbers as numbers: [2, 10], not [10, 2]
        f"meta-{split}": sorted((str(names[c]) for c in codes[split]), key=natural_key)
        for split in codes
    }
    if not float(data.fractions[1]) > 0:
        # Selecting on held-out cases of the meta-train classes would pick the checkpoint
        # that knows those classes best, not the one that learns new classes best.
        out["model selection"] = (
            "off: meta-val has no share in data.fractions, so the latest checkpoint is "
            "scored (nothing of the meta-train or meta-test split stands in for it)"
        )
    return out


def split_classes(partitioner: StratifiedTaskPartitioner, unit_classes: np.ndarray) -> dict:
    """`{split: sorted class codes}` of the units of each split."""
    return {
        split: np.unique(np.asarray(unit_classes)[partitioner.units(split)]).tolist()
        for split in ("train", "val", "test")
    }


def _entity_codes(store: Any, attribute: str, field: str) -> np.ndarray:
    """`[E]` label or stratum code of every store entity; `ValueError` when the store has
    no such column."""
    if store is None:
        raise ValueError(f"{field} needs a series store")
    names = store.label_names if attribute == "label" else store.stratum_names
    if len(names) <= 1 and (len(names) == 0 or str(names[0]) == ""):
        option = "--label-col" if attribute == "label" else "--stratum-col"
        raise ValueError(
            f"{field}: store {store.path} has no {attribute} column (ingest it with {option})"
        )
    codes = store.label_codes if attribute == "label" else store.stratum_codes
    return np.asarray(codes, dtype=np.int64)
