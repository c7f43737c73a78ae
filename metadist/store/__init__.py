"""The series store: Parquet in, one memory-mapped float32 file per store out.

`ingest(...)` (also `metadist ingest`) builds a store; `SeriesStore.open(path)` reads it;
`metadist verify PATH` checks it in full. This package imports numpy and pyarrow only.
"""

from metadist.store.format import FORMAT_VERSION
from metadist.store.ingest import ingest
from metadist.store.reader import SeriesStore
from metadist.store.scaler import Scaler

__all__ = ["FORMAT_VERSION", "Scaler", "SeriesStore", "ingest"]
