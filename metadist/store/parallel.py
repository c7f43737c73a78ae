"""Ordered parallel streams for the ingest passes.

Each pass splits its input into items (row groups of the Parquet files, or chunks of
whole entities of the store) and hands them to worker threads: Parquet decoding and the
numpy work on whole arrays release the GIL, so the threads use the cores. The results
come back **in item order**, whatever thread finished first, so the main thread merges
statistics and meets errors exactly as one worker would: the output and the error
messages do not depend on the number of workers.

Memory is bounded by a budget for the results in flight, never by the input.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Generic, TypeVar

try:
    import resource
except ImportError:  # not Unix
    resource = None  # type: ignore[assignment]

Item = TypeVar("Item")
Result = TypeVar("Result")

_DONE = object()
# items handed out per thread ahead of the caller (the results waiting stay within the
# budget whatever this is: only the item the caller is on may exceed it)
_LOOKAHEAD = 2


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class _Stream:
    """The queued results of one item, and their total size."""

    def __init__(self) -> None:
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.queued = 0


def ordered_streams(
    items: Iterable[Item],
    produce: Callable[[Item], Iterator[Result]],
    workers: int,
    budget: int,
    size_of: Callable[[Result], int] = lambda result: 1,
) -> Iterator[tuple[Item, Result]]:
    """Yields `(item, result)` for every result of `produce(item)`, items in the order
    given and each item's results in the order produced, while up to `workers` items are
    produced at once by a pool of `workers` threads.

    Up to `2 * workers` items are handed out ahead of the one the caller is taking
    results from, so that a thread done with its item starts the next at once rather
    than waiting for the caller to reach it (the caller takes items in order; one slow
    item would otherwise leave the other threads idle).

    The threads live as long as the stream: per-thread state that `produce` keeps (an
    open file, see `thread_cache`) is reused across items and dropped at the end.

    Results waiting for the caller total at most `budget` (in units of `size_of`, e.g.
    bytes) plus one result: a thread whose result does not fit waits, until the caller
    has taken results. The thread of the item the caller is taking results from only
    waits while results of its own are queued, so the caller always has something to
    take and the stream cannot deadlock.

    An exception raised by `produce` is re-raised in the caller when the caller reaches
    that item's results, so the first error in item order wins. Closing the generator
    (or an exception in the caller) stops the threads and waits for them.
    """
    pool = _OrderedPool(items, produce, max(1, workers), budget, size_of)
    pool.start()
    try:
        yield from pool.in_order()
    finally:
        pool.stop()


class _OrderedPool(Generic[Item, Result]):
    """The threads, the items handed out and the results waiting of one `ordered_streams`.

    `waiting` (the size of all results queued) and `head` (the stream the caller is
    taking results from) are guarded by `room`, which threads wait on for room in the
    budget.
    """

    def __init__(
        self,
        items: Iterable[Item],
        produce: Callable[[Item], Iterator[Result]],
        num_threads: int,
        budget: int,
        size_of: Callable[[Result], int],
    ) -> None:
        self.produce = produce
        self.num_threads = num_threads
        self.budget = budget
        self.size_of = size_of
        self.source = iter(items)
        self.stopping = threading.Event()
        self.room = threading.Condition()
        self.waiting = 0
        self.head: _Stream | None = None
        self.pending: deque[tuple[Item, _Stream]] = deque()
        self.work: queue.SimpleQueue = queue.SimpleQueue()  # (item, stream), or None to end
        self.threads = [
            threading.Thread(target=self._serve, name="metadist-ingest-worker", daemon=True)
            for _ in range(num_threads)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def in_order(self) -> Iterator[tuple[Item, Result]]:
        """The results, item after item; an item's error is raised once it is reached."""
        for _ in range(_LOOKAHEAD * self.num_threads):
            if not self._start_next():
                break
        while self.pending:
            item, stream = self.pending[0]
            with self.room:
                self.head = stream
                self.room.notify_all()
            error = yield from self._take(item, stream)
            self.pending.popleft()
            if error is not None:
                raise error
            self._start_next()

    def stop(self) -> None:
        """Stops the threads (those waiting for room give up) and waits for them."""
        self.stopping.set()
        with self.room:
            self.room.notify_all()
        for _ in self.threads:
            self.work.put(None)
        for thread in self.threads:
            thread.join()

    def _take(
        self, item: Item, stream: _Stream
    ) -> Generator[tuple[Item, Result], None, BaseException | None]:
        """Yields `stream`'s results as they come, freeing their room; returns the error
        `produce` raised for `item`, if any."""
        while True:
            result, error, size = stream.results.get()
            with self.room:
                self.waiting -= size
                stream.queued -= size
                self.room.notify_all()
            if result is _DONE:
                return error
            yield item, result

    def _start_next(self) -> bool:
        """Hands the next item to the threads; False when there is none."""
        for item in self.source:
            stream = _Stream()
            self.pending.append((item, stream))
            self.work.put((item, stream))
            return True
        return False

    def _serve(self) -> None:
        """One pool thread: items from `work` until told to end, with its own cache."""
        _THREAD_STATE.cache = ThreadCache(_cache_size(self.num_threads))
        try:
            while (task := self.work.get()) is not None and not self.stopping.is_set():
                self._run(*task)
        finally:
            _THREAD_STATE.__dict__.pop("cache").clear()

    def _run(self, item: Item, stream: _Stream) -> None:
        try:
            for result in self.produce(item):
                if not self._put(stream, result, None, self.size_of(result)):
                    return
            self._put(stream, _DONE, None, 0)
        except BaseException as error:  # handed to the caller, in item order
            self._put(stream, _DONE, error, 0)

    def _put(self, stream: _Stream, result: object, error: BaseException | None, size: int) -> bool:
        """Queues a result once it fits the budget; False if the stream is stopping."""
        with self.room:
            while not self.stopping.is_set() and self.waiting + size > self.budget:
                mine = stream.queued if self.head is stream else self.waiting
                if mine == 0:
                    break
                self.room.wait(0.05)
            if self.stopping.is_set():
                return False
            self.waiting += size
            stream.queued += size
        stream.results.put((result, error, size))
        return True


_THREAD_STATE = threading.local()


class ThreadCache:
    """Values a pool thread keeps across items (e.g. the Parquet files it reads), at
    most `size` of them: the least recently used is closed to make room, and all are
    closed when the stream ends. The size keeps the threads' open files well within
    the process's limit, whatever the number of input files."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: OrderedDict = OrderedDict()

    def get(self, key):
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def put(self, key, value) -> None:
        self._values[key] = value
        while len(self._values) > self.size:
            _close(self._values.popitem(last=False)[1])

    def clear(self) -> None:
        while self._values:
            _close(self._values.popitem(last=False)[1])


def _close(value) -> None:
    close = getattr(value, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):  # one failing close must not stop the rest
            close()


def _cache_size(num_threads: int) -> int:
    """Open files each pool thread may keep: a quarter of the process's limit on open
    files, shared by the threads (between 2 and 256 each)."""
    limit = 1024
    if resource is not None:
        with contextlib.suppress(OSError, ValueError):
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if limit == resource.RLIM_INFINITY or limit <= 0:
                limit = 1 << 16
    return max(2, min(256, limit // (4 * num_threads)))


def thread_cache() -> ThreadCache | None:
    """The cache of the calling thread of an `ordered_streams` pool, or None in any
    other thread."""
    return getattr(_THREAD_STATE, "cache", None)
