"""metadist.datasets."""
