"""The statistical forecast baselines of many series, on every core.

`StatisticalForecasts` computes each task's naive, seasonal-naive, naive 2 and Theta
forecasts of its history (and AutoETS when it is scored) with the functions of
`metadist.eval.baselines`, in a process pool (`concurrent.futures`) of at most
`os.cpu_count()` workers: `start(jobs)` hands a batch's series to the workers and returns
at once, so they run while this process adapts and trains the networks, and `collect`
returns the forecasts in the jobs' order. Every series is forecast by the same function
whichever process runs it, so the forecasts are identical to one process's (a test checks
it); with one worker they are computed here. Forecasts the `EvalCache` holds are not
computed again.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

import numpy as np

from metadist.eval.baselines import (
    ets_forecast,
    naive2_forecast,
    naive_forecast,
    seasonal_naive_forecast,
    theta_forecast,
)
from metadist.eval.cache import CACHE_VERSION, EvalCache, digest

# One series to forecast: (history [t, T] in original units, horizon, seasonal period).
Job = tuple[np.ndarray, int, int]
# Series per piece of work handed to a worker, at most (smaller pieces balance the load).
_CHUNK = 32
# Seconds between two progress updates while waiting for the workers.
_POLL_S = 1.0


def statistical_forecasts(
    history: np.ndarray, horizon: int, period: int, methods: Sequence[str]
) -> dict[str, np.ndarray]:
    """`{method: [horizon, T]}`: naive, seasonal naive, naive 2 and Theta of `history
    [t, T]`, and ETS when `methods` has it."""
    out = {
        "naive": naive_forecast(history, horizon),
        "seasonal_naive": seasonal_naive_forecast(history, horizon, period),
        "naive2": naive2_forecast(history, horizon, period),
        "theta": theta_forecast(history, horizon, period),
    }
    if "ets" in methods:
        out["ets"] = ets_forecast(history, horizon, period)
    return out


def forecast_jobs(jobs: Sequence[Job], methods: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """`statistical_forecasts` of every job, in order (what one worker runs)."""
    return [statistical_forecasts(h, horizon, m, methods) for h, horizon, m in jobs]


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class Pending:
    """The forecasts of one `start` call: those the cache held, and the workers' futures."""

    def __init__(self, num_jobs: int) -> None:
        self.forecasts: list[dict[str, np.ndarray] | None] = [None] * num_jobs
        self.keys: list[str] = [""] * num_jobs
        # (positions in the jobs, the future or the jobs to compute here)
        self.parts: list[tuple[list[int], Future | list[Job]]] = []


class StatisticalForecasts:
    """The statistical baselines of batches of series (see the module docstring).

    Args:
        methods: the methods scored (`ets` among them adds AutoETS).
        workers: processes to use (default: the cores this process may run on); 1
            computes in this process.
        cache: forecasts kept from an earlier evaluation, and where new ones are kept.
        counter: a progress counter advanced by the series done (`metadist.progress`).
    """

    def __init__(
        self,
        methods: Sequence[str],
        workers: int | None = None,
        cache: EvalCache | None = None,
        counter: Any = None,
    ) -> None:
        # the optional baselines scored (the others always are)
        self.extra = tuple(m for m in ("ets",) if m in methods)
        # AutoETS is statsforecast's: its forecasts are computed afresh on another version
        self._libraries = (_ets_version(),) if self.extra else ()
        self.workers = default_workers() if workers is None else max(1, int(workers))
        self.cache = cache
        self.counter = counter
        self.done = 0
        self._pool: ProcessPoolExecutor | None = None

    def key(self, history: np.ndarray, horizon: int, period: int) -> str:
        """The cache key of one series' forecasts (statsforecast's version in it where
        AutoETS is scored)."""
        parts = ("statistical", CACHE_VERSION, self.extra, *self._libraries)
        return digest(*parts, horizon, period, history)

    def start(self, jobs: Sequence[Job]) -> Pending:
        """Starts the forecasts of `jobs` (cached ones are taken from the cache)."""
        pending = Pending(len(jobs))
        missing = []
        for index, (history, horizon, period) in enumerate(jobs):
            key = self.key(history, horizon, period)
            pending.keys[index] = key
            found = None if self.cache is None else self.cache.get("statistical forecasts", key)
            if found is None:
                missing.append(index)
            else:
                pending.forecasts[index] = dict(found)
        self._advance(len(jobs) - len(missing))
        pool = self._executor() if len(missing) > 1 else None
        step = max(1, min(_CHUNK, -(-len(missing) // self.workers)))
        for first in range(0, len(missing), step):
            positions = missing[first : first + step]
            part = [jobs[i] for i in positions]
            work = pool.submit(forecast_jobs, part, self.extra) if pool else part
            pending.parts.append((positions, work))
        return pending

    def collect(self, pending: Pending) -> list[dict[str, np.ndarray]]:
        """The forecasts of `pending`, in the jobs' order (waiting for the workers)."""
        futures = {id(work): work for _, work in pending.parts if isinstance(work, Future)}
        while futures:
            finished, _ = wait(list(futures.values()), _POLL_S, FIRST_COMPLETED)
            for future in finished:
                futures.pop(id(future))
                self._advance(len(future.result()))
        for positions, work in pending.parts:
            results = work.result() if isinstance(work, Future) else forecast_jobs(work, self.extra)
            if not isinstance(work, Future):
                self._advance(len(positions))
            for index, forecast in zip(positions, results, strict=True):
                pending.forecasts[index] = forecast
                if self.cache is not None:
                    self.cache.put("statistical forecasts", pending.keys[index], forecast)
        out = pending.forecasts
        assert all(f is not None for f in out)  # every position is cached or computed
        return [f for f in out if f is not None]

    def close(self) -> None:
        """Stops the workers (pending work is cancelled)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ProcessPoolExecutor | None:
        if self.workers < 2:
            return None
        if self._pool is None:
            # fork where it is safe and fast (Linux: the workers need nothing imported
            # again); elsewhere the platform's default start method
            context = multiprocessing.get_context("fork") if sys.platform == "linux" else None
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=_leave_ctrl_c_to_the_parent
            )
        return self._pool

    def _advance(self, num_series: int) -> None:
        self.done += num_series
        if self.counter is not None and num_series:
            self.counter.update(self.done)


def _leave_ctrl_c_to_the_parent() -> None:
    """A worker ignores SIGINT: a Ctrl-C reaches the whole process group, and each worker
    printed a `KeyboardInterrupt` traceback beside the command's one line; the parent
    stops them (`close`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _ets_version() -> str | None:
    """statsforecast's version (`None` where it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("statsforecast")
    except PackageNotFoundError:
        return None
