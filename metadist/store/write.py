"""Pass 2 of `metadist ingest`: scale every row and write it to its place in the store.

Workers decode row groups again and write each batch's scaled rows straight into the
preallocated, memory-mapped `values.bin`: the rows of regular entities to their final
slot (see `plan.py`), the others after the rows already written for their entity. Only
the reservation of those slots is serialised (a lock around the per-entity cursor); the
slots an irregular entity's rows land in depend on thread timing, but pass 3 sorts them
by time, so the store bytes do not.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from metadist.store import sources
from metadist.store.batch_stats import dictionary_of, lookup, nonfinite, used_entries
from metadist.store.files import PAGE_BYTES, MappedFile
from metadist.store.format import TIMES_DTYPE, TIMES_FILE, VALUES_DTYPE, VALUES_FILE
from metadist.store.order import FILLED_FILE, EarlyFinisher
from metadist.store.parallel import ordered_streams
from metadist.store.plan import IngestPlan
from metadist.store.progress import Bar
from metadist.store.scan import ScanResult
from metadist.store.settings import IngestSettings


class Demoted(Exception):
    """Entities (store indices) that pass 1 took for regular but whose times are not."""

    def __init__(self, entities: np.ndarray) -> None:
        super().__init__(f"{len(entities)} entities are not regular")
        self.entities = entities


@dataclass
class _Shared:
    """State of pass 2 shared by the workers."""

    values: MappedFile
    times: MappedFile
    filled: MappedFile  # slots of placed series that received a row (times: pass 3)
    cursor: np.ndarray  # [E] rows written so far of each irregular entity
    lock: threading.Lock = field(default_factory=threading.Lock)
    misfits: list[np.ndarray] = field(default_factory=list)


def write(
    settings: IngestSettings, scan: ScanResult, plan: IngestPlan, temp: Path, bar: Bar
) -> tuple[IngestPlan, EarlyFinisher | None, float]:
    """Pass 2; returns the plan, with entities demoted from regular where their times
    turned out not to be a progression (the pass is then redone once for them), the
    pass 3 work done meanwhile on the regions already complete (with two workers or
    more; see `EarlyFinisher`) and the seconds taken.

    Raises:
        ValueError: the input changed since pass 1.
    """
    began = time.perf_counter()
    sources.check_unchanged(list(settings.files))
    while True:
        early = EarlyFinisher(settings, plan, temp) if settings.workers > 1 else None
        try:
            _write_all(settings, scan, plan, temp, bar, early)
            break
        except Demoted as demoted:  # rare: redo the pass with those entities sorted
            plan = plan.demote(demoted.entities)
            for name in (VALUES_FILE, TIMES_FILE, FILLED_FILE):
                (temp / name).unlink()
    return plan, early, time.perf_counter() - began


def _write_all(
    settings: IngestSettings,
    scan: ScanResult,
    plan: IngestPlan,
    temp: Path,
    bar: Bar,
    early: EarlyFinisher | None,
) -> None:
    num_columns = len(settings.value_names)
    task = bar.add("write", settings.num_rows_read)
    # resident pages of the three mappings: half the memory limit for the values, an
    # eighth for each of the others (releasing sooner costs page faults, not bytes)
    budget = settings.memory_limit
    with (
        MappedFile(
            temp / VALUES_FILE,
            VALUES_DTYPE,
            (plan.num_rows, num_columns),
            release_bytes=max(budget // 2, 8 << 20),
        ) as values,
        MappedFile(
            temp / TIMES_FILE,
            TIMES_DTYPE,
            (plan.num_rows,),
            release_bytes=max(budget // 8, 4 << 20),
        ) as times,
        MappedFile(
            temp / FILLED_FILE,
            np.dtype(bool),
            (plan.num_rows,),
            release_bytes=max(budget // 8, 4 << 20),
        ) as filled,
    ):
        shared = _Shared(values, times, filled, np.zeros(len(plan.order), np.int64))
        writer = _Writer(settings, scan, plan, shared)
        if early is not None:
            early.start(mapped=(values, times, filled))
        try:
            for _, (num_rows, entities, counts) in ordered_streams(  # small results
                settings.units, writer.unit_batches, settings.workers, 1, lambda found: 0
            ):
                bar.advance(task, num_rows)
                # not once a misfit is known: the pass is redone, and the misfit's
                # chunk would look like a duplicate to the finisher
                if early is not None and not shared.misfits:
                    early.written(entities, counts)
            if shared.misfits:
                raise Demoted(np.unique(np.concatenate(shared.misfits)))
            irregular = ~plan.regular
            if not np.array_equal(shared.cursor[irregular], plan.lengths[irregular]):
                raise ValueError("the input files changed while they were being ingested")
        except BaseException:
            if early is not None:
                early.stop()  # its work is dropped with the files
            raise
        finally:
            if early is not None:  # it goes on after the mappings are closed
                early.forget_mappings()


class _Writer:
    def __init__(
        self, settings: IngestSettings, scan: ScanResult, plan: IngestPlan, shared: _Shared
    ) -> None:
        self.settings = settings
        self.scan = scan
        self.plan = plan
        self.shared = shared
        # rows scattered between checks of the resident pages: each may make a page
        # resident, and the workers together stay within about half the values' budget
        pages = shared.values.release_bytes // (2 * settings.workers * PAGE_BYTES)
        self.slice_rows = max(1024, min(8192, pages))

    def unit_batches(self, unit: sources.Unit):
        settings = self.settings
        for number, (_, batch) in enumerate(
            sources.iter_unit(
                unit, settings.write_columns, settings.batch_size, settings.dictionary_columns
            )
        ):
            yield (batch.num_rows, *self._write_batch(unit, number, batch))

    def _entity_codes(
        self, unit: sources.Unit, number: int, batch: pa.RecordBatch
    ) -> tuple[np.ndarray, np.ndarray]:
        """`([N] batch-local entity codes, [U] pass 1 code of each)`: pass 1's codes for
        the same batch where kept and its dictionary is the same size, else found by
        looking the ids up again."""
        column = batch.column(self.settings.columns.entity)
        local, dictionary = used_entries(*dictionary_of(column))
        mapping = self.scan.batch_maps.get((unit.number, number))
        if mapping is not None and len(mapping) == len(dictionary):
            return local, mapping
        mapping = lookup(self.scan.entities.codes, dictionary)
        if len(np.unique(mapping)) != len(mapping):  # a dictionary with repeated entries
            local, dictionary = used_entries(*dictionary_of(column.dictionary_decode()))
            mapping = lookup(self.scan.entities.codes, dictionary)
        return local, mapping

    def _write_batch(
        self, unit: sources.Unit, number: int, batch: pa.RecordBatch
    ) -> tuple[np.ndarray, np.ndarray]:
        """Writes a batch's rows; returns `([K] store entities, [K] rows written of
        each)`."""
        settings, plan, shared = self.settings, self.plan, self.shared
        local, mapping = self._entity_codes(unit, number, batch)
        if (mapping < 0).any():
            raise ValueError(f"{unit.file.path} changed while it was being ingested")
        entity = plan.new_index[mapping]  # [U] store index, -1 if dropped
        times = sources.to_int64_time(batch.column(settings.columns.time))
        # float32 columns stay float32: the scaling below computes in float64 all the same
        values = sources.float_columns(batch, settings.value_names, keep_float32=True)
        keep = (entity >= 0)[local] if (entity < 0).any() else None
        if settings.nan == "drop":
            masks = nonfinite(values)
            if masks:
                finite = np.logical_and.reduce(list(masks.values()))
                keep = finite if keep is None else keep & finite
        if keep is not None:
            local, times, values = local[keep], times[keep], [x[keep] for x in values]
        if local.size == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        entity = np.maximum(entity, 0)
        scaled = np.empty((local.size, len(values)), VALUES_DTYPE)
        for j, column in enumerate(values):
            if settings.scaling == "global":
                centred = np.subtract(column, plan.global_mean[j], dtype=np.float64)
                scaled[:, j] = np.divide(centred, plan.global_std[j], out=centred)
            elif settings.scaling == "per-entity":
                mean = plan.entity_mean[entity, j]
                std = plan.entity_std[entity, j]
                centred = np.subtract(column, mean[local], dtype=np.float64)
                scaled[:, j] = np.divide(centred, std[local], out=centred)
            else:
                scaled[:, j] = column
        destination, placed = self._destinations(local, entity, times)
        # whole rows as single opaque items: one copy per row instead of one per value
        row_type = np.dtype((np.void, scaled.shape[1] * scaled.itemsize))
        target = shared.values.array.view(row_type).reshape(-1)
        rows = scaled.view(row_type).reshape(-1)
        # in slices, so that the resident pages are checked every few MB of pages per
        # worker (rows a page apart each make a page resident)
        step = self.slice_rows
        # (`np.put`: a plain loop over the indices, two to three times faster than an
        # indexed assignment of the same rows)
        for a in range(0, destination.size, step):
            np.put(target, destination[a : a + step], rows[a : a + step])
            shared.values.wrote(destination[a : a + step])
        filled = destination if placed is None else destination[placed]
        for a in range(0, filled.size, step):
            np.put(shared.filled.array, filled[a : a + step], True)
            shared.filled.wrote(filled[a : a + step])
        if placed is not None:
            sorted_later = destination[~placed]
            shared.times.array[sorted_later] = times[~placed]
            shared.times.wrote(sorted_later)
        per_entity = np.bincount(local, minlength=entity.size)
        present = np.flatnonzero(per_entity)
        return entity[present], per_entity[present]

    def _destinations(
        self, local: np.ndarray, entity: np.ndarray, times: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """`[N]` row of `values.bin` for each row of a batch (see `plan.py`), and which
        rows went to their final slot (None: all of them)."""
        plan, shared = self.plan, self.shared
        regular = plan.regular[entity]
        start = plan.starts[entity]
        step = plan.step[entity]
        if regular.all() and (step == 1).all():
            return (start - plan.first_time[entity])[local] + times, None
        destination = np.empty(local.size, np.int64)
        placed = regular[local]
        if regular.any():
            rows = np.flatnonzero(placed) if not placed.all() else slice(None)
            row_local = local[rows]
            offset, remainder = np.divmod(
                times[rows] - plan.first_time[entity][row_local], step[row_local]
            )
            destination[rows] = start[row_local] + offset
            misfit = remainder != 0
            if misfit.any():  # not a progression after all: this pass is redone
                shared.misfits.append(np.unique(entity[row_local[misfit]]))
                destination[np.arange(local.size)[rows][misfit]] = start[row_local[misfit]]
        if not placed.all():
            rows = np.flatnonzero(~placed)
            order = np.argsort(local[rows], kind="stable")
            rows = rows[order]
            group = entity[local[rows]]
            group_starts = np.flatnonzero(np.diff(group, prepend=-1))
            group_sizes = np.diff(group_starts, append=group.size)
            rank = np.arange(group.size) - np.repeat(group_starts, group_sizes)
            heads = group[group_starts]
            with shared.lock:
                base = shared.cursor[heads].copy()
                shared.cursor[heads] += group_sizes
                overflow = (shared.cursor[heads] > plan.lengths[heads]).any()
            if overflow:
                raise ValueError("the input files changed while they were being ingested")
            destination[rows] = plan.starts[group] + np.repeat(base, group_sizes) + rank
        return destination, (None if placed.all() else placed)
