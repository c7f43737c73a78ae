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
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

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


class _Shared:
    """What the worker threads share: bytes of results waiting, and the head item."""

    def __init__(self) -> None:
        self.waiting = 0
        self.head: _Stream | None = None


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
    stop = threading.Event()
    room = threading.Condition()
    state = _Shared()
    pending: deque[tuple[Item, _Stream]] = deque()
    work: queue.SimpleQueue = queue.SimpleQueue()  # (item, stream), or None to end a thread
    source = iter(items)

    def run(item: Item, stream: _Stream) -> None:
        def put(result: object, error: BaseException | None, size: int) -> bool:
            with room:
                while not stop.is_set() and state.waiting + size > budget:
                    mine = stream.queued if state.head is stream else state.waiting
                    if mine == 0:
                        break
                    room.wait(0.05)
                if stop.is_set():
                    return False
                state.waiting += size
                stream.queued += size
            stream.results.put((result, error, size))
            return True

        try:
            for result in produce(item):
                if not put(result, None, size_of(result)):
                    return
            put(_DONE, None, 0)
        except BaseException as error:  # handed to the caller, in item order
            put(_DONE, error, 0)

    num_threads = max(1, workers)

    def serve() -> None:
        _THREAD_STATE.cache = ThreadCache(_cache_size(num_threads))
        try:
            while (task := work.get()) is not None and not stop.is_set():
                run(*task)
        finally:
            _THREAD_STATE.__dict__.pop("cache").clear()

    def start_next() -> bool:
        for item in source:
            stream = _Stream()
            pending.append((item, stream))
            work.put((item, stream))
            return True
        return False

    threads = [
        threading.Thread(target=serve, name="metadist-ingest-worker", daemon=True)
        for _ in range(num_threads)
    ]
    for thread in threads:
        thread.start()
    try:
        for _ in range(_LOOKAHEAD * num_threads):
            if not start_next():
                break
        while pending:
            item, stream = pending[0]
            with room:
                state.head = stream
                room.notify_all()
            while True:
                result, error, size = stream.results.get()
                with room:
                    state.waiting -= size
                    stream.queued -= size
                    room.notify_all()
                if result is _DONE:
                    break
                yield item, result
            pending.popleft()
            if error is not None:
                raise error
            start_next()
    finally:
        stop.set()
        with room:
            room.notify_all()
        for _ in threads:
            work.put(None)
        for thread in threads:
            thread.join()


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
