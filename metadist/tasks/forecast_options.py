"""The forecast sampler's options (`ForecastSampler.Options`) and the checks that need no
store: counts, choices, padding and chunk length, and the rows one task needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metadist.tasks.options import check_positive


@dataclass(frozen=True)
class ForecastOptions:
    """The forecast sampler's options (`sampler.options`; `ForecastSampler.Options`).

    Attributes:
        lookback: L, input rows per window.
        horizon: H, target rows per window.
        num_support: K support windows per task.
        num_query: Q query windows per task.
        stride: s, rows between consecutive windows of a task.
        input_columns: store columns fed as inputs (default: all columns).
        target_columns: store columns to forecast (default: the store's targets).
        split: "random" (tau uniform over the valid range) or "end" (tau as late as
            possible, so the last query window's targets are the unit's last H rows:
            the evaluation protocol).
        unit: "entity" (one unit per entity) or "chunk" (one unit per `chunk_length`
            rows of an entity, the last chunk taking the remainder, an entity shorter
            than `chunk_length` but long enough for a task being one chunk; windows
            never leave their chunk), for panels with few, long series.
        chunk_length: rows per chunk with `unit="chunk"`.
        pad_inputs: P, how many input rows of a window may lie before the unit's
            first row (0 .. L-1); they repeat the unit's first value. Lets short
            series (a competition's yearly data) give tasks; targets are always real
            rows.
        labels: keep only the entities whose store label is one of these (e.g. one
            frequency of a forecasting competition, for a model per frequency); None
            keeps every entity.
        recent_splits: R, draw a random split row only among the last R of its valid
            range (the most recent windows of each unit); None draws from all of it.
            Ignored by `split="end"`, which takes the last one.
    """

    lookback: int = 32
    horizon: int = 8
    num_support: int = 8
    num_query: int = 1
    stride: int = 1
    input_columns: Sequence[str] | None = None
    target_columns: Sequence[str] | None = None
    split: str = "random"
    unit: str = "entity"
    chunk_length: int | None = None
    pad_inputs: int = 0
    labels: Sequence[str] | None = None
    recent_splits: int | None = None

    def validate(self) -> None:
        """Checks what needs no store; `ValueError` naming the option."""
        check_positive(
            "forecast",
            lookback=self.lookback,
            horizon=self.horizon,
            num_support=self.num_support,
            num_query=self.num_query,
            stride=self.stride,
        )
        for field, value, choices in (
            ("split", self.split, ("random", "end")),
            ("unit", self.unit, ("entity", "chunk")),
        ):
            if value not in choices:
                raise ValueError(
                    f"forecast sampler: {field} must be {choices[0]!r} or {choices[1]!r}, "
                    f"got {value!r}"
                )
        pad = self.pad_inputs
        if isinstance(pad, bool) or not isinstance(pad, (int, np.integer)):
            pad = -1
        if not 0 <= pad < self.lookback:
            raise ValueError(
                f"forecast sampler: pad_inputs must be an integer in [0, lookback - 1 = "
                f"{self.lookback - 1}], got {self.pad_inputs!r}"
            )
        if self.recent_splits is not None:
            check_positive("forecast", recent_splits=self.recent_splits)
        self._check_chunk_length()

    def _check_chunk_length(self) -> None:
        if self.unit != "chunk":
            if self.chunk_length is not None:
                raise ValueError("forecast sampler: chunk_length is only used with unit='chunk'")
            return
        if self.chunk_length is None:
            raise ValueError("forecast sampler: unit='chunk' needs chunk_length")
        check_positive("forecast", chunk_length=self.chunk_length)
        if self.chunk_length < self.rows_per_task:
            raise ValueError(
                f"forecast sampler: chunk_length={self.chunk_length} cannot hold one "
                f"task, which needs {self.need_text()} = {self.rows_per_task} rows"
            )

    @property
    def rows_per_task(self) -> int:
        """Fewest rows a unit needs: L + 2H + (K + Q - 2)·stride - pad_inputs."""
        return (
            self.lookback
            + 2 * self.horizon
            + (self.num_support + self.num_query - 2) * self.stride
            - self.pad_inputs
        )

    def need_text(self) -> str:
        """`rows_per_task` spelt out with the options' names, for messages."""
        return (
            f"lookback {self.lookback} + 2·horizon {self.horizon} + "
            f"(num_support {self.num_support} + num_query {self.num_query} - 2)·stride "
            f"{self.stride}" + (f" - pad_inputs {self.pad_inputs}" if self.pad_inputs else "")
        )
