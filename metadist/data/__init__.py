"""metadist.data: partitioning units into splits and ranks, and loading task batches."""

from metadist.data.loader import BatchMetaDataLoader
from metadist.data.loader_settings import LoaderSettings
from metadist.data.partition import Deal, StratifiedTaskPartitioner, UnitDealer
from metadist.data.splits import SPLIT_BY, STRATIFY_BY, build_partitioner

__all__ = [
    "SPLIT_BY",
    "STRATIFY_BY",
    "BatchMetaDataLoader",
    "Deal",
    "LoaderSettings",
    "StratifiedTaskPartitioner",
    "UnitDealer",
    "build_partitioner",
]
