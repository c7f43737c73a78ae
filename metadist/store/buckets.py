"""Pass 2's rows held in memory per region of the store, until pass 3 takes the region.

Pass 2 scatters each batch's rows to their rows of the store. Written through the
memory mapping, every first touch of a page faults, and the kernel zero-fills the page
(and the pages it reads ahead) before the row lands; pass 3 then reads the region back
(`pread`), and writes it again where it fills gaps. A **bucket** is instead an
in-memory buffer of one chunk of the store (the entity ranges of `IngestPlan.chunks`,
the unit of pass 3): pass 2 scatters the chunk's rows into it, and pass 3 orders,
fills and checksums the bucket and writes it to the file once, whole (`pwrite` of full
pages: no fault, no zero-filling, no read back).

Memory stays bounded: a chunk gets a bucket when pass 2 first writes to it, while the
buckets held stay within a byte budget; a chunk that finds the budget spent is
**mapped** instead (written through the mapping as before, its byte range reserved on
disk first, so that a full disk fails a call and never faults a mapped write). Input
that completes the store region by region (writers that deal rows over files side by
side put related rows into the same row group of each file, and `sources.units` reads
them together) needs only the buckets of the few regions open at a time. Which chunks
are buffered depends on thread timing; the bytes of the store do not.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from metadist.store.files import PAGE_BYTES, reserve_range
from metadist.store.format import TIMES_DTYPE, VALUES_DTYPE
from metadist.store.plan import IngestPlan

_UNTOUCHED, _BUFFERED, _MAPPED = 0, 1, 2


@dataclass
class Bucket:
    """The rows of one chunk of the store, `[n]` rows from store row `first_row`."""

    first_row: int
    values: np.ndarray  # [n, C] float32, scaled
    times: np.ndarray  # [n] int64: the rows of entities pass 3 sorts (else unset)
    filled: np.ndarray  # [n] bool: slots of placed entities that received a row

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.times.nbytes + self.filled.nbytes


class Buckets:
    """The buckets of one pass 2, for the chunks `plan.chunks(chunk_rows)`.

    Args:
        plan: the store's plan.
        chunks: pass 3's chunks, `[first, last)` store entities each (`order.store_chunks`).
        num_columns: value columns of the store.
        budget: bytes of buckets held at once (0: every chunk is mapped).
        files: `(values fd, times fd)` of the store files, sized but not reserved: a
            chunk turned mapped has its byte range reserved (`posix_fallocate`).
    """

    def __init__(
        self,
        plan: IngestPlan,
        chunks: list[tuple[int, int]],
        num_columns: int,
        budget: int,
        files: tuple[int, int],
    ) -> None:
        self.chunks = chunks
        sizes = np.array([last - first for first, last in self.chunks], np.int64)
        self.chunk_of_entity = np.repeat(np.arange(len(self.chunks)), sizes)  # [E]
        ends = plan.starts + plan.lengths
        self.first_row = np.array([plan.starts[a] for a, _ in self.chunks], np.int64)
        self.end_row = np.array([ends[b - 1] for _, b in self.chunks], np.int64)
        self.num_columns = num_columns
        self.budget = budget
        self.files = files
        self.held = 0  # bytes of the buckets not taken yet
        self.mode = np.zeros(len(self.chunks), np.int8)
        self._buckets: dict[int, Bucket] = {}
        self._lock = threading.Lock()

    def claim(self, chunks: np.ndarray) -> list[Bucket | None]:
        """The bucket of each chunk in `chunks` (`[K]` distinct), None for a mapped one;
        a chunk not written to before is given a bucket if the budget allows, else
        mapped (its range reserved on disk)."""
        with self._lock:
            fresh = [int(k) for k in chunks if self.mode[k] == _UNTOUCHED]
            for k in fresh:
                rows = int(self.end_row[k] - self.first_row[k])
                size = rows * (self.num_columns * VALUES_DTYPE.itemsize + TIMES_DTYPE.itemsize + 1)
                if self.held + size <= self.budget:
                    self._buckets[k] = Bucket(
                        int(self.first_row[k]),
                        np.empty((rows, self.num_columns), VALUES_DTYPE),
                        np.empty(rows, TIMES_DTYPE),
                        np.zeros(rows, bool),
                    )
                    self.held += size
                    self.mode[k] = _BUFFERED
                else:
                    self._reserve(k)
                    self.mode[k] = _MAPPED
            return [self._buckets.get(int(k)) for k in chunks]

    def take(self, first_entity: int) -> Bucket | None:
        """The bucket of the chunk that starts at store entity `first_entity`, handed
        over for good (pass 3 makes it final), or None if that chunk is mapped or
        received no row."""
        k = int(self.chunk_of_entity[first_entity])
        assert self.chunks[k][0] == first_entity, "pass 3 walks the chunks of pass 2"
        with self._lock:
            bucket = self._buckets.pop(k, None)
            if bucket is not None:
                self.held -= bucket.nbytes
            elif self.mode[k] == _UNTOUCHED:  # written by nobody: mapped from now on
                self.mode[k] = _MAPPED
            return bucket

    def _reserve(self, k: int) -> None:
        """Reserves the chunk's bytes (whole pages) in both store files."""
        for fd, row_bytes in zip(
            self.files,
            (self.num_columns * VALUES_DTYPE.itemsize, TIMES_DTYPE.itemsize),
            strict=True,
        ):
            low = int(self.first_row[k]) * row_bytes // PAGE_BYTES * PAGE_BYTES
            high = -(-int(self.end_row[k]) * row_bytes // PAGE_BYTES) * PAGE_BYTES
            size = os.fstat(fd).st_size
            if min(high, size) > low:
                reserve_range(fd, low, min(high, size) - low)
