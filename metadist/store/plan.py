"""What pass 1 learned, frozen: the store's entities, their places and statistics.

Placement without sorting. Pass 1 records each entity's first and last time. An entity
whose row count fits an arithmetic progression between them (`span = (rows - 1) *
step` for an integral step) is *regular*: pass 2 writes each of its rows straight to its
final, time-sorted slot `start + (t - first) / step`, and pass 3 only checks that every
slot holds the expected time (a duplicate time leaves a slot unfilled). Other entities
are written in arrival order and sorted by pass 3. Regular series, the common case, are
never sorted, so ingest costs little more than reading the Parquet twice.

When the input is in store order already and pass 1 copied its raw rows (`in_place`),
passes 2 and 3 are replaced by one pass that scales the copied rows where they lie.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadist.store.scaler import scale_of
from metadist.store.scan import ScanResult
from metadist.store.settings import IngestSettings


@dataclass(frozen=True)
class IngestPlan:
    """The store to write: `[E]` arrays are in store order (entities sorted by id)."""

    order: np.ndarray  # [E] pass 1's entity code of each store entity
    new_index: np.ndarray  # [seen] store index of each entity code, -1 if dropped
    entity_ids: list[str]
    starts: np.ndarray  # [E] first row
    lengths: np.ndarray  # [E] rows
    num_rows: int
    entity_count: np.ndarray  # [E, C] finite values
    entity_mean: np.ndarray
    entity_m2: np.ndarray
    entity_std: np.ndarray
    has_gaps: np.ndarray  # [E] holds a NaN/inf/null value somewhere (needs filling)
    global_count: np.ndarray  # [C]
    global_mean: np.ndarray
    global_m2: np.ndarray
    global_std: np.ndarray
    dropped: list[tuple[Any, tuple[str, str]]]  # (entity id, (kind, reason)) sorted by id
    category_of: dict[str, np.ndarray]  # "stratum"/"label" -> [E] names
    first_time: np.ndarray  # [E]
    step: np.ndarray  # [E] time step of regular entities (1 for the others)
    regular: np.ndarray  # [E] rows placed directly by pass 2
    in_place: bool  # pass 1's raw copy is the store but for scaling and filling
    entity_keys: list[Any]  # pass 1's entity code -> id as read

    def demote(self, entities: np.ndarray) -> IngestPlan:
        """The same plan with `entities` (store indices) sorted instead of placed."""
        regular = self.regular.copy()
        regular[entities] = False
        return dataclasses.replace(self, regular=regular, step=np.where(regular, self.step, 1))

    def chunks(self, chunk_rows: int) -> list[tuple[int, int]]:
        """Entity ranges `[a, b)` of about `chunk_rows` rows each (whole entities)."""
        ends = self.starts + self.lengths
        chunks, first = [], 0
        while first < len(ends):
            last = int(np.searchsorted(ends, self.starts[first] + chunk_rows, side="right"))
            last = max(last, first + 1)
            chunks.append((first, last))
            first = last
        return chunks


def make_plan(settings: IngestSettings, scan: ScanResult) -> IngestPlan:
    """Decides which entities are kept, their order, offsets, statistics and whether
    their rows can be placed directly.

    Raises:
        ValueError: no entity is left to store.
    """
    num_seen = len(scan.entities)
    keys = scan.entities.keys()
    rows = scan.rows[:num_seen]
    count = scan.count[:num_seen]
    reasons = _drop_reasons(settings, rows, count)
    kept = np.ones(num_seen, bool)
    kept[list(reasons)] = False
    if not kept.any():
        raise ValueError(_nothing_left(settings, reasons, rows, scan.finite_any))
    kept_codes = np.flatnonzero(kept)
    sort_keys = np.asarray([keys[c] for c in kept_codes])
    order = kept_codes[np.argsort(sort_keys, kind="stable")]
    new_index = np.full(num_seen, -1, np.int64)
    new_index[order] = np.arange(len(order))
    lengths = rows[order].copy()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    entity_count = count[order].copy()
    entity_mean = scan.mean[order].copy()
    entity_m2 = scan.m2[order].copy()
    total = entity_count.sum(axis=0)
    weights = np.divide(entity_count, total, out=np.zeros_like(entity_count), where=total > 0)
    global_mean = (weights * entity_mean).sum(axis=0)
    spread = entity_count * (entity_mean - global_mean) ** 2
    global_m2 = entity_m2.sum(axis=0) + spread.sum(axis=0)
    category_of: dict[str, np.ndarray] = {}
    for role in ("stratum", "label"):
        codes = getattr(scan, role)[order]
        names = scan.category_names[role].keys()
        category_of[role] = (
            np.asarray(names, dtype=object)[codes] if names else np.full(len(order), "", object)
        )
    first_time, last_time = scan.first_time[order], scan.last_time[order]
    gaps = np.maximum(lengths - 1, 1)
    with np.errstate(over="ignore"):
        span = last_time - first_time
    step = np.where(lengths > 1, span // gaps, 1)
    regular = (lengths == 1) | ((span > 0) & (span % gaps == 0))
    regular &= step > 0
    return IngestPlan(
        order=order,
        new_index=new_index,
        entity_ids=[str(keys[c]) for c in order],
        starts=starts,
        lengths=lengths,
        num_rows=int(lengths.sum()),
        entity_count=entity_count,
        entity_mean=entity_mean,
        entity_m2=entity_m2,
        entity_std=scale_of(entity_count, entity_m2),
        has_gaps=np.asarray((entity_count < lengths[:, None]).any(axis=1)),
        global_count=total,
        global_mean=global_mean,
        global_m2=global_m2,
        global_std=scale_of(total, global_m2),
        dropped=sorted(((keys[c], r) for c, r in reasons.items()), key=lambda p: str(p[0])),
        category_of=category_of,
        first_time=first_time,
        step=np.where(regular, step, 1),
        regular=regular,
        in_place=_in_store_order(settings, scan, order, lengths),
        entity_keys=keys,
    )


def _drop_reasons(
    settings: IngestSettings, rows: np.ndarray, count: np.ndarray
) -> dict[int, tuple[str, str]]:
    reasons: dict[int, tuple[str, str]] = {}
    if settings.nan == "drop":
        for code in np.flatnonzero(rows == 0):
            reasons[int(code)] = ("no rows left", "every row has a NaN, inf or null value")
    if settings.nan == "ffill":
        empty = count == 0
        for code in np.flatnonzero(empty.any(axis=1)):
            column = settings.value_names[int(np.argmax(empty[code]))]
            reasons[int(code)] = (
                "nothing to fill from",
                f"column {column!r} has no finite value to fill from",
            )
    for code in np.flatnonzero((rows < settings.min_length) & (rows > 0)):
        reasons.setdefault(
            int(code),
            ("too short", f"{rows[code]} rows, fewer than --min-length {settings.min_length}"),
        )
    return reasons


def _nothing_left(
    settings: IngestSettings, reasons: dict, rows: np.ndarray, finite_any: np.ndarray
) -> str:
    kinds = Counter(kind for kind, _ in reasons.values())
    parts = []
    if kinds["too short"]:
        parts.append(
            f"{kinds['too short']} entities are shorter than --min-length "
            f"{settings.min_length} (the longest has {int(rows.max())} rows)"
        )
    if kinds["no rows left"]:
        parts.append(f"{kinds['no rows left']} entities have only NaN/inf/null rows")
    if kinds["nothing to fill from"]:
        parts.append(
            f"{kinds['nothing to fill from']} entities have a column without any finite value"
        )
    # A column without a finite value in any entity: name it and the input files.
    empty = [n for n, ok in zip(settings.value_names, finite_any, strict=True) if not ok]
    if empty:
        names = [str(f.path) for f in settings.files]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        what = f"column {empty[0]!r} has" if len(empty) == 1 else f"columns {empty} have"
        parts.append(f"{what} no finite value in any row of {shown}")
    return "no entity left to store: " + "; ".join(parts)


def _in_store_order(
    settings: IngestSettings, scan: ScanResult, order: np.ndarray, lengths: np.ndarray
) -> bool:
    """Whether pass 1's raw copy (rows at their input position) is the store's layout:
    every input row kept, each entity's rows one run in time order, entities in store
    order."""
    if not scan.raw or not scan.runs or int(lengths.sum()) != settings.num_rows_read:
        return False
    code, row, length, first, last = (np.concatenate(part) for part in zip(*scan.runs, strict=True))
    by_row = np.argsort(row, kind="stable")
    code, row, length, first, last = (
        code[by_row],
        row[by_row],
        length[by_row],
        first[by_row],
        last[by_row],
    )
    if not np.array_equal(row[1:], row[:-1] + length[:-1]):
        return False
    # runs of one entity that continue in the next batch merge into one
    continued = (code[1:] == code[:-1]) & (first[1:] > last[:-1])
    new_run = np.concatenate([[True], ~continued])
    return np.array_equal(code[new_run], order)
