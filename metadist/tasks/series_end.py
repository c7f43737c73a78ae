"""Windows that end where a series ends: the forecasting protocol's support and query.

To forecast what follows row `end` of a series, a learner adapts on the K support windows
whose targets end at `end` and forecasts from the rows just before it. With lookback L,
horizon H and stride s:

- support window k (k = 0..K-1) starts at row end - L - H - (K-1-k)·s: inputs at rows
  [start, start+L), targets at [start+L, start+L+H); the last one's targets end at `end`;
- query window j starts at row end - L + j·s: the first one's inputs are the L rows
  before `end`, its targets (where the series has them) the H rows from `end`.

`end` is the split row of a forecast task (`metadist.tasks.forecast`), or the number of
rows of a history whose future is unknown (`Run.forecast`) or held out (a competition's
holdout, `metadist.tasks.holdout`). Rows before a series' first row repeat it; the
padding policy says which:

- `"inputs"`: up to `pad_inputs` P input rows of a window may lie before the first row
  (as forecasting competitions pad short series); targets are always real rows, so a
  series needs L + H + (K-1)·s - P rows and gives K windows.
- `"series"`: any row may, as if the series were front-filled with its first row to
  L + H rows (targets too); a series gives as many windows as fit in max(n, L + H) rows,
  at most K.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from metadist.tasks.windows import WindowGatherer

Padding = Literal["inputs", "series"]
PADDINGS: tuple[Padding, ...] = ("inputs", "series")


@dataclass(frozen=True)
class SeriesEndWindows:
    """Where the support and query windows ending at a row lie, and how they are padded.

    Args:
        lookback: L, input rows per window.
        horizon: H, target rows per window.
        num_support: K, support windows (at most K with `padding="series"`).
        stride: s, rows between consecutive windows.
        padding: `"inputs"` or `"series"` (see the module docstring).
        pad_inputs: P, with `padding="inputs"`: how many input rows of a window may lie
            before the series' first row (0 .. L-1).

    Raises:
        ValueError: an unknown padding, or a `pad_inputs` outside [0, L-1] or with
            `padding="series"`.
    """

    lookback: int
    horizon: int
    num_support: int
    stride: int
    padding: Padding
    pad_inputs: int = 0

    def __post_init__(self) -> None:
        if self.padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}, got {self.padding!r}")
        if not 0 <= self.pad_inputs < self.lookback:
            raise ValueError(
                f"pad_inputs must be in [0, lookback - 1 = {self.lookback - 1}], "
                f"got {self.pad_inputs}"
            )
        if self.padding == "series" and self.pad_inputs:
            raise ValueError("pad_inputs is only used with padding='inputs'")

    @property
    def rows_needed(self) -> int:
        """Fewest rows a series needs before `end`: L + H + (K-1)·s - P with `"inputs"`,
        1 with `"series"`."""
        if self.padding == "series":
            return 1
        window = self.lookback + self.horizon
        return window + (self.num_support - 1) * self.stride - self.pad_inputs

    def num_windows(self, num_rows: int) -> int:
        """Support windows a series of `num_rows` rows gives (K, or fewer with `"series"`)."""
        if self.padding == "inputs":
            return self.num_support
        window = self.lookback + self.horizon
        return min(self.num_support, (max(num_rows, window) - window) // self.stride + 1)

    def support_starts(self, end: np.ndarray | int, num_windows: int | None = None) -> np.ndarray:
        """`[*S, K']` int64 first rows of the support windows ending at `end` (shape S;
        K' = `num_windows`, default K), oldest first."""
        k = self.num_support if num_windows is None else int(num_windows)
        first = np.asarray(end, dtype=np.int64) - self.lookback - self.horizon
        return first[..., None] - (k - 1 - np.arange(k)) * self.stride

    def query_starts(self, end: np.ndarray | int, num_query: int = 1) -> np.ndarray:
        """`[*S, Q]` int64 first rows of the query windows at `end` (shape S)."""
        first = np.asarray(end, dtype=np.int64) - self.lookback
        return first[..., None] + np.arange(num_query) * self.stride

    def inputs(
        self, gatherer: WindowGatherer, starts: np.ndarray, first_row: np.ndarray
    ) -> np.ndarray:
        """Input windows at `starts` (`[*S, L, F]`); rows before `first_row` (broadcastable
        to S) repeat it where the policy pads inputs."""
        if self.padding == "series" or self.pad_inputs:
            return gatherer.gather(starts, first_row)
        return gatherer.gather(starts)

    def targets(
        self, gatherer: WindowGatherer, starts: np.ndarray, first_row: np.ndarray
    ) -> np.ndarray:
        """Target windows of the windows at `starts` (`[*S, H, T]`, rows from start + L);
        rows before `first_row` repeat it with `"series"` only."""
        rows = starts + self.lookback
        if self.padding == "series":
            return gatherer.gather(rows, first_row)
        return gatherer.gather(rows)

    def cut(
        self, series: np.ndarray, input_columns: Sequence[int], target_columns: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The windows ending at the last row of one series.

        Args:
            series: `[n, C]` rows of one series.
            input_columns: the F columns of the inputs.
            target_columns: the T columns of the targets.

        Returns:
            `(support_x [K', L, F], support_y [K', H, T], query_x [1, L, F])` in the
            series' dtype, K' = `num_windows(n)`.

        Raises:
            ValueError: a series shorter than `rows_needed`.
        """
        num_rows = len(series)
        if num_rows < self.rows_needed:
            raise ValueError(
                f"a series of {num_rows} rows is too short for {self.num_support} windows of "
                f"{self.lookback} + {self.horizon} rows (stride {self.stride}, up to "
                f"{self.pad_inputs} input rows padded): it needs at least L + H + (K-1)*stride "
                f"- padded = {self.lookback} + {self.horizon} + {self.num_support - 1}*"
                f"{self.stride} - {self.pad_inputs} = {self.rows_needed}"
            )
        inputs = WindowGatherer(series, input_columns, self.lookback)
        targets = WindowGatherer(series, target_columns, self.horizon)
        starts = self.support_starts(num_rows, self.num_windows(num_rows))
        first = np.zeros(1, np.int64)
        return (
            self.inputs(inputs, starts, first),
            self.targets(targets, starts, first),
            self.inputs(inputs, self.query_starts(num_rows), first),
        )
