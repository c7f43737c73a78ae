"""Gathering many fixed-length windows of a store in one numpy operation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided


class WindowGatherer:
    """Copies windows `[rows r .. r+length)` of some columns of a `[num_rows, C]` array.

    The array is seen through a strided view `[num_rows - length + 1, length, F]` in which
    window r is element r, so a batch of windows is one indexing operation along axis 0 (a
    block copy per window, no Python loop). When the columns are not one contiguous run, it
    falls back to one fancy-indexing gather.

    Args:
        values: `[num_rows, C]` array (e.g. a store's read-only memory map).
        columns: column indices, in output order.
        length: window length (rows).
    """

    def __init__(self, values: np.ndarray, columns: Sequence[int], length: int) -> None:
        self.columns = np.asarray(columns, dtype=np.int64)
        self.length = int(length)
        num_rows = values.shape[0]
        first = int(self.columns[0])
        contiguous = bool(np.array_equal(self.columns, np.arange(first, first + len(columns))))
        self.values = values
        self.view: np.ndarray | None = None
        if contiguous and num_rows >= length:
            part = np.asarray(values)[:, first : first + len(self.columns)]
            row_stride, col_stride = part.strides
            self.view = as_strided(
                part,
                shape=(num_rows - length + 1, length, len(self.columns)),
                strides=(row_stride, row_stride, col_stride),
                writeable=False,
            )

    def gather(self, rows: np.ndarray, first_row: np.ndarray | None = None) -> np.ndarray:
        """Windows starting at `rows` (any shape S) as a contiguous `[*S, length, F]` array.

        With `first_row` (broadcastable to S), rows before it read row `first_row` instead:
        windows reaching back past the start of their series repeat its first value.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if first_row is not None:
            offsets = np.arange(self.length, dtype=np.int64)
            floor = np.broadcast_to(np.asarray(first_row, dtype=np.int64), rows.shape)
            row_index = np.maximum(rows[..., None] + offsets, floor[..., None])[..., None]
            return np.ascontiguousarray(np.asarray(self.values)[row_index, self.columns])
        if self.view is not None:
            # Indexing, not np.take: take would first copy the whole strided view.
            return self.view[rows]
        offsets = np.arange(self.length, dtype=np.int64)
        row_index = (rows[..., None] + offsets)[..., None]
        return np.ascontiguousarray(np.asarray(self.values)[row_index, self.columns])
