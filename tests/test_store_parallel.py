"""`ordered_streams`: results in item order whatever the threads' timing, the first
error in item order, and results in flight held to the budget."""

from __future__ import annotations

import threading
import time

import pytest

from metadist.store.parallel import ThreadCache, _cache_size, ordered_streams, thread_cache


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers, budget", [(1, 1000), (4, 1000), (4, 25), (7, 1)])
def test_results_in_item_order_within_budget(workers, budget):
    lock = threading.Lock()
    in_flight = {"now": 0, "peak": 0}

    def produce(item: int):
        for k in range(item % 5 + 1):
            time.sleep(0.0005 * ((item * 7 + k) % 3))  # threads finish out of order
            with lock:
                in_flight["now"] += 10
                in_flight["peak"] = max(in_flight["peak"], in_flight["now"])
            yield item, k

    seen = []
    for item, (same, k) in ordered_streams(range(40), produce, workers, budget, lambda r: 10):
        with lock:
            in_flight["now"] -= 10
        assert same == item
        seen.append((item, k))
    assert seen == [(i, k) for i in range(40) for k in range(i % 5 + 1)]
    # a result counts from just before it is queued: beyond the budget, each worker may
    # hold one result it has made but not queued yet, and the head item's thread one more
    # (it queues past the budget so that the consumer can always move on)
    assert in_flight["peak"] <= max(budget, 10) + 10 * (workers + 1)


@pytest.mark.timeout(60)
def test_first_error_in_item_order_wins():
    def produce(item: int):
        if item in (3, 6):
            time.sleep(0.05 if item == 3 else 0)  # item 6 fails first in time
            raise ValueError(f"bad item {item}")
        yield item

    with pytest.raises(ValueError, match="bad item 3"):
        list(ordered_streams(range(10), produce, 8, 100))
    assert not [t for t in threading.enumerate() if t.name == "metadist-ingest-worker"]


class _Handle:
    """Stands for an open file a worker keeps in its thread cache."""

    def __init__(self, registry: list) -> None:
        self.closed = False
        registry.append(self)

    def close(self) -> None:
        self.closed = True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [1, 3])
def test_a_pool_of_workers_threads_keeps_its_cache_across_items(workers):
    opened: list[_Handle] = []
    threads: set[int] = set()
    lock = threading.Lock()

    def produce(item: int):
        cache = thread_cache()
        assert cache is not None
        with lock:
            threads.add(threading.get_ident())
        if cache.get("file") is None:
            cache.put("file", _Handle(opened))
        yield item, cache.get("file")

    results = list(ordered_streams(range(50), produce, workers, 100))
    assert [item for item, _ in results] == list(range(50))
    # one thread per worker for all 50 items, each opening its file once
    assert len(threads) <= workers
    assert len(opened) == len(threads)
    assert all(handle.closed for handle in opened)  # closed when the stream ended
    assert thread_cache() is None  # the caller's thread has no cache
    assert not [t for t in threading.enumerate() if t.name == "metadist-ingest-worker"]


@pytest.mark.timeout(60)
def test_closing_the_stream_early_stops_the_pool():
    def produce(item: int):
        for k in range(100):
            yield item, k

    stream = ordered_streams(range(100), produce, 4, 10)
    assert next(stream) == (0, (0, 0))
    stream.close()
    assert not [t for t in threading.enumerate() if t.name == "metadist-ingest-worker"]


def test_a_thread_cache_closes_the_least_recently_used_beyond_its_size():
    opened: list[_Handle] = []
    cache = ThreadCache(2)
    for key in ("a", "b"):
        cache.put(key, _Handle(opened))
    assert cache.get("a") is opened[0]  # "b" is now the least recently used
    cache.put("c", _Handle(opened))
    assert [handle.closed for handle in opened] == [False, True, False]
    assert cache.get("b") is None and cache.get("a") is opened[0]
    cache.clear()
    assert all(handle.closed for handle in opened)


def test_open_files_per_thread_stay_within_the_process_limit():
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for threads in (1, 2, 16, 64):
        size = _cache_size(threads)
        assert 2 <= size <= 256
        assert threads * size <= max(soft // 4, 2 * threads)


@pytest.mark.timeout(60)
def test_a_thread_done_early_goes_on_while_the_caller_waits_on_a_slow_item():
    later_done = threading.Semaphore(0)

    def produce(item: int):
        if item == 0:  # the caller waits on this one until items 1-3 have run
            yield all(later_done.acquire(timeout=10) for _ in range(3))
            return
        if item in (1, 2, 3):
            later_done.release()
        yield True

    results = list(ordered_streams(range(8), produce, 2, 100))
    assert [item for item, _ in results] == list(range(8))
    # the second thread ran items 1, 2 and 3 while item 0 was still being produced
    assert results[0][1] is True
