"""metadist.data: partitioning units into splits and ranks, and loading task batches."""

from metadist.data.loader import BatchMetaDataLoader
from metadist.data.partition import Deal, StratifiedTaskPartitioner, UnitDealer

__all__ = ["BatchMetaDataLoader", "Deal", "StratifiedTaskPartitioner", "UnitDealer"]
