"""`ordered_streams`: results in item order whatever the threads' timing, the first
error in item order, and results in flight held to the budget."""

from __future__ import annotations

import threading
import time

import pytest

from metadist.store.parallel import ordered_streams


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
