"""The last pass of `metadist ingest`: make every chunk of the store final and checksum it.

`order_rows` (after pass 2) checks placed entities, sorts the others, fills and
checksums. `finish_in_place` (when pass 1's raw copy is already in store order) scales
and fills the copied rows where they lie. Both walk the store in chunks of whole
entities with pread/pwrite (sequential, no page faults, memory bounded by the chunk
size); workers handle chunks in parallel and the main thread checksums them in file
order.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metadist.store import sources
from metadist.store.arrow import to_numpy
from metadist.store.files import MappedFile, RawFile
from metadist.store.format import (
    TIMES_DTYPE,
    TIMES_FILE,
    VALUES_DTYPE,
    VALUES_FILE,
    Checksum,
)
from metadist.store.parallel import ordered_streams
from metadist.store.plan import IngestPlan
from metadist.store.progress import Bar
from metadist.store.settings import IngestSettings

FILLED_FILE = ".filled"  # one byte per store row, in the temporary directory only


def _chunk_rows(settings: IngestSettings) -> int:
    return max(settings.batch_size * 4, 1 << 18)


def _checksum_chunks(
    settings: IngestSettings,
    plan: IngestPlan,
    temp: Path,
    bar: Bar,
    name: str,
    work,
    skip: int = 0,
    num_rows_done: int = 0,
    sums: tuple[Checksum, Checksum] | None = None,
) -> dict[str, str]:
    """Runs `work(values_file, times_file, first, last)` on every chunk of entities
    after the first `skip` (done already, `num_rows_done` rows checksummed into `sums`)
    in workers; each returns the chunk's final `(values, times)` and the main thread
    checksums them in order. Both files are fsynced at the end."""
    num_columns = len(settings.value_names)
    values_sum, times_sum = sums if sums is not None else (Checksum(), Checksum())
    task = bar.add(name, plan.num_rows)
    bar.advance(task, num_rows_done)
    with (
        RawFile(temp / VALUES_FILE, num_columns * VALUES_DTYPE.itemsize) as vf,
        RawFile(temp / TIMES_FILE, TIMES_DTYPE.itemsize) as tf,
    ):

        def produce(chunk: tuple[int, int]):
            yield work(vf, tf, *chunk)

        for _, (values, times) in ordered_streams(
            plan.chunks(_chunk_rows(settings))[skip:],
            produce,
            settings.workers,
            settings.memory_limit,
            lambda chunk: chunk[0].nbytes + chunk[1].nbytes,
        ):
            values_sum.update(values)
            times_sum.update(times)
            bar.advance(task, times.size)
    return {VALUES_FILE: values_sum.hexdigest(), TIMES_FILE: times_sum.hexdigest()}


def finish_in_place(
    settings: IngestSettings, plan: IngestPlan, temp: Path, bar: Bar
) -> tuple[dict[str, str], float]:
    """Scales (and fills) pass 1's raw copy where it lies; returns the checksums and the
    seconds taken."""
    began = time.perf_counter()
    sources.check_unchanged(list(settings.files))
    num_columns = len(settings.value_names)

    def work(vf: RawFile, tf: RawFile, first: int, last: int):
        row_a = int(plan.starts[first])
        row_b = int(plan.starts[last - 1] + plan.lengths[last - 1])
        values = vf.read(row_a, row_b, VALUES_DTYPE).reshape(-1, num_columns)
        times = tf.read(row_a, row_b, TIMES_DTYPE)
        lengths = plan.lengths[first:last]
        if settings.scaling == "global":
            mean, std = plan.global_mean, plan.global_std
        else:
            mean = np.repeat(plan.entity_mean[first:last], lengths, axis=0)
            std = np.repeat(plan.entity_std[first:last], lengths, axis=0)
        changed = settings.scaling != "none"
        if changed:
            _scale(values, mean, std)
        if settings.nan == "ffill" and plan.has_gaps[first:last].any():
            starts = plan.starts[first:last] - row_a
            changed |= _fill_chunk(values, starts, lengths, plan.has_gaps[first:last])
        if changed:
            vf.write(row_a, values)
        vf.start_writeback(row_a, row_b)
        tf.start_writeback(row_a, row_b)
        return values, times

    checksums = _checksum_chunks(settings, plan, temp, bar, "finish", work)
    return checksums, time.perf_counter() - began


def _scale(values: np.ndarray, mean: np.ndarray, std: np.ndarray) -> None:
    """`values[:] = float32((float64(values) - mean) / std)` in place, in blocks small
    enough for the float64 temporary to stay in cache; `mean`/`std` are `[C]` or rows
    like `values`."""
    block = 16384
    buffer = np.empty((min(block, len(values)), values.shape[1]))
    for a in range(0, len(values), block):
        rows = values[a : a + block]
        temp = buffer[: len(rows)]
        per_row = mean.ndim == 2
        np.subtract(rows, mean[a : a + block] if per_row else mean, out=temp)
        np.divide(temp, std[a : a + block] if per_row else std, out=temp)
        rows[...] = temp


def _order_chunk(
    settings: IngestSettings,
    plan: IngestPlan,
    filled: MappedFile,
    vf: RawFile,
    tf: RawFile,
    first: int,
    last: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Makes the store entities `[first, last)` final after pass 2 (times of placed
    entities written and checked, irregular ones sorted, gaps filled) and lets the disk
    take them; returns their final `(values, times)` for the checksums."""
    num_columns = len(settings.value_names)
    row_a = int(plan.starts[first])
    row_b = int(plan.starts[last - 1] + plan.lengths[last - 1])
    lengths = plan.lengths[first:last]
    starts = plan.starts[first:last] - row_a
    regular = plan.regular[first:last]
    if regular.all():
        times = np.empty(row_b - row_a, TIMES_DTYPE)
    else:
        times = tf.read(row_a, row_b, TIMES_DTYPE)
    values = vf.read(row_a, row_b, VALUES_DTYPE).reshape(-1, num_columns)
    changed = False
    if regular.any():
        chunk_filled = np.array(filled.array[row_a:row_b])
        filled.touched(row_a, row_b, row_b - row_a)
        _place_times(settings, plan, first, times, chunk_filled, starts, lengths, regular)
    if not regular.all():
        changed = _sort_irregular(settings, plan, first, times, values, lengths, regular)
    if settings.nan == "ffill" and plan.has_gaps[first:last].any():
        changed |= _fill_chunk(values, starts, lengths, plan.has_gaps[first:last])
    if changed:
        vf.write(row_a, values)
    if changed or regular.any():
        tf.write(row_a, times)
    vf.start_writeback(row_a, row_b)
    tf.start_writeback(row_a, row_b)
    return values, times


class EarlyFinisher:
    """Pass 3 on the chunks that pass 2 has written whole, while pass 2 goes on.

    Input written side by side (Spark, Dask, `write_synthetic_panel`) completes the
    store region by region. The main thread of pass 2 tells `written` how many rows of
    which entities each batch wrote, in input order; a thread of this class finishes
    every chunk all of whose rows are there, in store order, and starts its writes to
    disk. The disk then works while pass 2 still computes, rather than in the final
    fsync, and the chunks are read back while they are still in the page cache.
    `order_rows` does the chunks left at the end of pass 2 with every worker.

    The stores are byte for byte those of pass 3 alone: the same work per chunk, the
    checksums taken in store order. An error (a duplicate time) stops the thread and is
    raised by `order_rows`, after any error of pass 2: the first in store order, as
    pass 3 alone would raise it.
    """

    def __init__(self, settings: IngestSettings, plan: IngestPlan, temp: Path) -> None:
        self.settings = settings
        self.plan = plan
        self.temp = temp
        self.chunks = plan.chunks(_chunk_rows(settings))
        self.remaining = plan.lengths.copy()  # [E] rows pass 2 has not reported yet
        self.ready = 0  # chunks whose rows are all written (set by the main thread)
        self.done = 0  # chunks finished and checksummed (set by the thread)
        self.num_rows_done = 0
        self.values_sum, self.times_sum = Checksum(), Checksum()
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._files: tuple[RawFile, RawFile, MappedFile] | None = None
        self._mapped: tuple[MappedFile, ...] = ()
        self._mapped_lock = threading.Lock()

    def start(self, mapped: tuple[MappedFile, ...] = ()) -> None:
        """Starts the thread; pass 2 has created the store files.

        Args:
            mapped: pass 2's mappings of the store files: the pages of a chunk are
                dropped from them before its writeback starts (see
                `MappedFile.release_rows`).
        """
        with self._mapped_lock:
            self._mapped = mapped
        row_bytes = len(self.settings.value_names) * VALUES_DTYPE.itemsize
        with contextlib.ExitStack() as opened:  # all three, or none left open
            values_file = opened.enter_context(RawFile(self.temp / VALUES_FILE, row_bytes))
            times_file = opened.enter_context(RawFile(self.temp / TIMES_FILE, TIMES_DTYPE.itemsize))
            filled = MappedFile(
                self.temp / FILLED_FILE, np.dtype(bool), (self.plan.num_rows,), existing=True
            )
            opened.pop_all()
        self._files = (values_file, times_file, filled)
        self._thread = threading.Thread(
            target=self._run, name="metadist-ingest-finisher", daemon=True
        )
        self._thread.start()

    def forget_mappings(self) -> None:
        """Stops releasing pages from pass 2's mappings (called before it closes them;
        waits for a release under way)."""
        with self._mapped_lock:
            self._mapped = ()

    def written(self, entities: np.ndarray, counts: np.ndarray) -> None:
        """Notes that pass 2 wrote `counts[i]` rows of store entity `entities[i]` (in
        the main thread, after the worker wrote them)."""
        self.remaining[entities] -= counts
        ready = self.ready
        while ready < len(self.chunks):
            first, last = self.chunks[ready]
            if self.remaining[first:last].any():
                break
            ready += 1
        if ready != self.ready:
            with self._cond:
                self.ready = ready
                self._cond.notify()

    def _run(self) -> None:
        assert self._files is not None  # started
        vf, tf, filled = self._files
        while True:
            with self._cond:
                while not self._stopping and self.done >= self.ready:
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                first, last = self.chunks[self.done]
                row_a = int(self.plan.starts[first])
                row_b = int(self.plan.starts[last - 1] + self.plan.lengths[last - 1])
                with self._mapped_lock:  # pass 2 is done with these rows
                    for mapping in self._mapped:
                        mapping.release_rows(row_a, row_b)
                values, times = _order_chunk(self.settings, self.plan, filled, vf, tf, first, last)
                self.values_sum.update(values)
                self.times_sum.update(times)
            except BaseException as error:  # raised by `order_rows`, in store order
                self.error = error
                return
            self.num_rows_done += times.size
            with self._cond:
                self.done += 1

    def stop(self) -> None:
        """Stops the thread after the chunk in hand and closes its files, without
        flushing them (pass 3 fsyncs the store files; after a failed pass 2 they are
        removed)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._files is not None:
            values_file, times_file, filled = self._files
            self._files = None
            with contextlib.ExitStack() as closing:  # each is closed whatever the others do
                closing.callback(values_file.close)
                closing.callback(times_file.close)
                closing.callback(filled.__exit__, None, None, None)


def order_rows(
    settings: IngestSettings,
    plan: IngestPlan,
    temp: Path,
    bar: Bar,
    early: EarlyFinisher | None = None,
) -> tuple[dict[str, str], float]:
    """Pass 3 after pass 2: checks placed entities, sorts the others, fills, checksums;
    returns the checksums and the seconds taken. With `early`, the chunks it finished
    during pass 2 are taken as they are and the walk goes on from there.

    Raises:
        ValueError: a duplicate (entity, time), naming the two source rows.
    """
    began = time.perf_counter()
    if early is not None:
        early.stop()  # first: nothing of it may outlive this call
    sources.check_unchanged(list(settings.files))
    sums, skip, num_rows_done = (Checksum(), Checksum()), 0, 0
    if early is not None:
        if early.error is not None:
            raise early.error
        sums = (early.values_sum, early.times_sum)
        skip, num_rows_done = early.done, early.num_rows_done
    filled_path = temp / FILLED_FILE
    with MappedFile(filled_path, np.dtype(bool), (plan.num_rows,), existing=True) as filled:
        work = functools.partial(_order_chunk, settings, plan, filled)
        checksums = _checksum_chunks(
            settings, plan, temp, bar, "order", work, skip, num_rows_done, sums
        )
    filled_path.unlink()
    return checksums, time.perf_counter() - began


def _fill_chunk(
    values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, gaps: np.ndarray
) -> bool:
    """Forward-fills the entities of a chunk that pass 1 found non-finite values in
    (`gaps` `[E]`); the others are left unread. Few such entities: one at a time."""
    chosen = np.flatnonzero(gaps)
    if chosen.size > 64:
        return fill_forward(values, starts, lengths)
    changed = False
    for e in chosen:
        rows = values[starts[e] : starts[e] + lengths[e]]
        changed |= fill_forward(rows, np.zeros(1, np.int64), lengths[e : e + 1])
    return changed


def _place_times(
    settings: IngestSettings,
    plan: IngestPlan,
    first: int,
    times: np.ndarray,
    filled: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    regular: np.ndarray,
) -> None:
    """Writes `first_time + k * step` into the slots of the chunk's placed entities,
    after checking that pass 2 filled every one of them: a slot left empty means two
    rows had the same time (the row count matched a progression, the rows did not)."""
    last = first + len(lengths)
    rows = None if regular.all() else np.repeat(regular, lengths)
    empty = ~filled if rows is None else ~filled & rows
    if empty.any():
        row = int(np.argmax(empty))
        _raise_duplicate(
            settings, plan, first + int(np.searchsorted(starts, row, side="right")) - 1
        )
    within = np.arange(times.size) - np.repeat(starts, lengths)
    expected = np.repeat(plan.first_time[first:last], lengths)
    step = plan.step[first:last]
    if (step == 1).all():
        expected += within
    else:
        expected += within * np.repeat(step, lengths)
    if rows is None:
        times[:] = expected
    else:
        times[rows] = expected[rows]


def _sort_irregular(
    settings: IngestSettings,
    plan: IngestPlan,
    first: int,
    times: np.ndarray,
    values: np.ndarray,
    lengths: np.ndarray,
    regular: np.ndarray,
) -> bool:
    """Sorts the rows of the chunk's irregular entities by time, in place in `times`
    and `values`; returns whether anything moved."""
    rows = np.flatnonzero(np.repeat(~regular, lengths))
    entity = np.repeat(np.arange(first, first + len(lengths))[~regular], lengths[~regular])
    row_times = times[rows]
    same = entity[1:] == entity[:-1]
    moved = bool((same & (row_times[1:] < row_times[:-1])).any())
    if moved:
        by_time = rows[np.lexsort((row_times, entity))]
        values[rows] = values[by_time]
        times[rows] = times[by_time]
        row_times = times[rows]
    repeated = np.flatnonzero(same & (row_times[1:] == row_times[:-1]))
    if repeated.size:
        _raise_duplicate(settings, plan, int(entity[repeated[0]]))
    return moved


def _raise_duplicate(settings: IngestSettings, plan: IngestPlan, entity: int) -> None:
    """Raises the error for a duplicate time of store entity `entity`, naming the
    time and the two source rows (found by reading that entity's rows again)."""
    key = plan.entity_keys[plan.order[entity]]
    found = _source_rows(settings, key)
    times = np.asarray([t for t, _, _ in found], np.int64)
    unique, counts = np.unique(times, return_counts=True)
    if not (counts > 1).any():
        raise ValueError("the input files changed while they were being ingested")
    when = unique[np.argmax(counts > 1)]
    places = [(path, row) for t, path, row in found if t == when][:2]
    where = " and ".join(f"{path} row {row}" for path, row in places)
    raise ValueError(
        f"duplicate (entity, time): entity {key!r} has more than one row at "
        f"{settings.columns.time} = {_format_time(int(when), settings.time_kind)} ({where})"
    )


def _source_rows(settings: IngestSettings, key: Any) -> list[tuple[int, Path, int]]:
    """(time, file, row) of every stored row of entity `key` in the input."""
    columns = settings.columns
    found: list[tuple[int, Path, int]] = []
    for file in settings.files:
        for offset, batch in sources.iter_batches(
            file, [columns.entity, columns.time, *settings.value_names], settings.batch_size, ()
        ):
            entity = batch.column(columns.entity)
            match = pc.equal(entity, pa.scalar(key, entity.type))
            hit = to_numpy(match).astype(bool)
            if settings.nan == "drop" and hit.any():
                for column in sources.float_columns(batch, settings.value_names):
                    hit &= np.isfinite(column)
            times = sources.to_int64_time(batch.column(columns.time))
            found += [(int(times[r]), file.path, offset + int(r)) for r in np.flatnonzero(hit)]
    return found


def fill_forward(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Forward-fills non-finite values in place, within each entity of a chunk; values
    before an entity's first finite one take that first finite value. Works on the
    runs of non-finite values only, so its cost follows the number of gaps.

    Args:
        values: `[N, C]` rows of whole entities, time-sorted.
        starts, lengths: `[E]` entity row ranges within `values`; every entity has a
            finite value in every column.

    Returns:
        Whether anything was filled.
    """
    # flat positions of the non-finite cells: 20x faster than a reduction along axis 0
    # or a two-dimensional nonzero of the [N, C] mask
    bad = np.flatnonzero(~np.isfinite(values))
    if not bad.size:
        return False
    bad_rows, bad_columns = np.divmod(bad, values.shape[1])
    for j in np.unique(bad_columns):
        rows = bad_rows[bad_columns == j]
        entity = np.searchsorted(starts, rows, side="right") - 1
        new_run = np.ones(rows.size, bool)
        new_run[1:] = (rows[1:] != rows[:-1] + 1) | (entity[1:] != entity[:-1])
        run_first = rows[new_run]
        run_last = rows[np.append(np.flatnonzero(new_run)[1:] - 1, rows.size - 1)]
        run_entity = entity[new_run]
        source = np.where(run_first > starts[run_entity], run_first - 1, run_last + 1)
        values[rows, j] = values[np.repeat(source, run_last - run_first + 1), j]
    return True


def _format_time(value: int, kind: str) -> str:
    if kind == "timestamp":
        return str(np.datetime64(int(value), "ns"))
    return str(value)
