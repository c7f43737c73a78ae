"""The training log's window: means of the loss and metrics since the last metrics
record, and global tasks per second; its partial sums travel in a checkpoint."""

from __future__ import annotations

import time
from typing import Any


class MetricsWindow:
    """Means of the loss and metrics since the last metrics record, and tasks/s."""

    def __init__(self, step: int) -> None:
        self._restart(step)
        self.rate = 0.0

    def _restart(self, step: int) -> None:
        self.step0 = step
        self.time0 = time.perf_counter()
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, sums: dict[str, float], num_steps: int) -> None:
        """Adds the sums of the loss and metrics over `num_steps` steps."""
        for name, value in sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.count += num_steps

    def tasks_per_s(self, step: int, meta_batch_size: int) -> float:
        """Global tasks per second since the window opened."""
        elapsed = time.perf_counter() - self.time0
        if step > self.step0 and elapsed > 0:
            self.rate = (step - self.step0) * meta_batch_size / elapsed
        return self.rate

    def state(self) -> dict[str, Any]:
        """The partial sums, for a checkpoint: a resumed run's first metrics record then
        averages every step since the record before, as an uninterrupted run does."""
        return {"sums": dict(self.sums), "count": self.count}

    def restore(self, state: dict[str, Any]) -> None:
        self.sums = {str(k): float(v) for k, v in state["sums"].items()}
        self.count = int(state["count"])

    def flush(self, step: int, meta_batch_size: int) -> dict[str, float]:
        values = {name: total / max(self.count, 1) for name, total in self.sums.items()}
        values["tasks_per_s"] = self.tasks_per_s(step, meta_batch_size)
        self._restart(step)
        return values
