"""Ordered parallel streams for the ingest passes.

Each pass splits its input into items (row groups of the Parquet files, or chunks of
whole entities of the store) and hands them to worker threads: Parquet decoding and the
numpy work on whole arrays release the GIL, so the threads use the cores. The results
come back **in item order**, whatever thread finished first, so the main thread merges
statistics and meets errors exactly as one worker would: the output and the error
messages do not depend on the number of workers.

Memory is bounded by `workers * depth` results in flight, never by the input.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

_DONE = object()


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class _Stream:
    """The results of one item, produced by a worker thread into a bounded queue."""

    def __init__(self, depth: int) -> None:
        self.results: queue.Queue = queue.Queue(maxsize=depth)


def ordered_streams(
    items: Iterable[Item],
    produce: Callable[[Item], Iterator[Result]],
    workers: int,
    depth: int = 2,
) -> Iterator[tuple[Item, Result]]:
    """Yields `(item, result)` for every result of `produce(item)`, items in the order
    given and each item's results in the order produced, while up to `workers` items are
    produced at once in threads, each at most `depth` results ahead of the caller.

    An exception raised by `produce` is re-raised in the caller when the caller reaches
    that item's results, so the first error in item order wins. Closing the generator
    (or an exception in the caller) stops the threads and waits for them.
    """
    stop = threading.Event()
    pending: deque[tuple[Item, _Stream, threading.Thread]] = deque()
    source = iter(items)

    def run(item: Item, stream: _Stream) -> None:
        def put(entry: tuple[object, BaseException | None]) -> bool:
            while not stop.is_set():
                try:
                    stream.results.put(entry, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for result in produce(item):
                if not put((result, None)):
                    return
            put((_DONE, None))
        except BaseException as error:  # handed to the caller, in item order
            put((_DONE, error))

    def start_next() -> bool:
        for item in source:
            stream = _Stream(depth)
            thread = threading.Thread(
                target=run, args=(item, stream), name="metadist-ingest-worker", daemon=True
            )
            thread.start()
            pending.append((item, stream, thread))
            return True
        return False

    try:
        for _ in range(max(1, workers)):
            if not start_next():
                break
        while pending:
            item, stream, thread = pending[0]
            while True:
                result, error = stream.results.get()
                if result is _DONE:
                    break
                yield item, result
            thread.join()
            pending.popleft()
            if error is not None:
                raise error
            start_next()
    finally:
        stop.set()
        for _, stream, thread in pending:
            while thread.is_alive():
                try:
                    stream.results.get_nowait()
                except queue.Empty:
                    thread.join(timeout=0.05)
