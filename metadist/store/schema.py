"""What a store's `metadata.json` says of its columns, read the same way by an open
`SeriesStore` and by a run's record of its store (`train.artifact.RecordedStore`)."""

from __future__ import annotations

from typing import Any


class StoreColumns:
    """Column properties from `self.metadata` (the store's `metadata.json` as a dict)."""

    metadata: Any

    @property
    def num_columns(self) -> int:
        """C, the number of value columns (features, then extra targets)."""
        return len(self.metadata["column_names"])

    @property
    def feature_names(self) -> list[str]:
        return list(self.metadata["feature_names"])

    @property
    def target_names(self) -> list[str]:
        return list(self.metadata["target_names"])

    @property
    def column_names(self) -> list[str]:
        return list(self.metadata["column_names"])

    @property
    def time_kind(self) -> str:
        """`"int"` or `"timestamp"` (int64 nanoseconds since the epoch)."""
        return str(self.metadata["time_kind"])
