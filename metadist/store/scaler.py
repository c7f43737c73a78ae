"""Mergeable moments and the scaler that maps store values to and from original units.

Statistics are kept as (count, mean, M2) per column, so partial results from record
batches, files or entities combine exactly with the parallel formula of Chan, Golub and
LeVeque (1979). The scale of a column is its population standard deviation
`sqrt(M2 / count)`; a constant column gets scale 1 so that scaling never divides by 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from metadist.store.format import SCALING_KINDS


def merge_moments(
    count_a: np.ndarray,
    mean_a: np.ndarray,
    m2_a: np.ndarray,
    count_b: np.ndarray,
    mean_b: np.ndarray,
    m2_b: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Combines two sets of moments elementwise (Chan et al.'s parallel formula).

    All arguments broadcast against each other; a side with count 0 must have mean 0.

    Returns:
        `(count, mean, m2)` of the union of both samples.
    """
    count = count_a + count_b
    share_b = np.divide(count_b, count, out=np.zeros(np.shape(count)), where=count > 0)
    delta = mean_b - mean_a
    mean = mean_a + delta * share_b
    m2 = m2_a + m2_b + delta * delta * count_a * share_b
    return count, mean, m2


def scale_of(count: np.ndarray, m2: np.ndarray) -> np.ndarray:
    """Population standard deviation `sqrt(m2 / count)`, with 1 where it is 0 or undefined."""
    std = np.sqrt(np.divide(m2, count, out=np.zeros(np.shape(m2)), where=count > 0))
    return np.where(np.isfinite(std) & (std > 0), std, 1.0)


class Scaler:
    """Affine per-column scaling of a store: `scaled = (original - mean) / std`.

    For `kind == "global"` `mean`/`std` are `[C]`; for `"per-entity"` they are `[E, C]`
    (row = entity index); for `"none"` the scaler is the identity.

    Works on numpy arrays and, without importing torch, on torch tensors (the statistics
    are converted with the tensor's own `new_tensor`).

    Raises:
        ValueError: `kind` is not "global", "per-entity" or "none".
    """

    def __init__(self, kind: str, mean: np.ndarray, std: np.ndarray) -> None:
        if kind not in SCALING_KINDS:
            raise ValueError(f"unknown scaling kind {kind!r}; expected one of {SCALING_KINDS}")
        self.kind = kind
        self.mean = np.asarray(mean, dtype=np.float64)
        self.std = np.asarray(std, dtype=np.float64)

    def __repr__(self) -> str:
        return f"Scaler(kind={self.kind!r}, shape={self.mean.shape})"

    def _stats(self, values: Any, entity_index: Any, columns: Any) -> tuple[Any, Any]:
        num_columns = self.mean.shape[-1]
        cols = np.arange(num_columns) if columns is None else np.asarray(columns, dtype=np.int64)
        if cols.ndim != 1 or cols.size != values.shape[-1]:
            raise ValueError(
                f"columns selects {cols.size} columns but values' last dimension is "
                f"{values.shape[-1]}"
            )
        if cols.size and (cols.min() < -num_columns or cols.max() >= num_columns):
            raise ValueError(f"columns {cols.tolist()} out of range for {num_columns} columns")
        if self.kind == "global":
            mean, std = self.mean[cols], self.std[cols]
        else:
            if entity_index is None:
                raise ValueError("per-entity scaling needs entity_index")
            entities = np.asarray(
                entity_index.cpu() if hasattr(entity_index, "cpu") else entity_index,
                dtype=np.int64,
            )
            mean = self.mean[entities][..., cols]
            std = self.std[entities][..., cols]
        if hasattr(values, "new_tensor"):  # a torch tensor
            return values.new_tensor(mean), values.new_tensor(std)
        dtype = values.dtype if np.issubdtype(values.dtype, np.floating) else np.float64
        return mean.astype(dtype, copy=False), std.astype(dtype, copy=False)

    def transform(self, values: Any, entity_index: Any = None, columns: Any = None) -> Any:
        """Maps values in original units to scaled units.

        Args:
            values: `[..., C']` array or tensor.
            entity_index: int `[...]` broadcastable to `values.shape[:-1]`; needed for
                per-entity scaling, ignored otherwise.
            columns: the store column index of each of the C' last-dim entries (default:
                all store columns in order).

        Raises:
            ValueError: `columns` does not match `values`, or per-entity scaling without
                `entity_index`.
        """
        if self.kind == "none":
            return values
        mean, std = self._stats(values, entity_index, columns)
        return (values - mean) / std

    def inverse(self, values: Any, entity_index: Any = None, columns: Any = None) -> Any:
        """Maps scaled values back to original units (the inverse of `transform`)."""
        if self.kind == "none":
            return values
        mean, std = self._stats(values, entity_index, columns)
        return values * std + mean
