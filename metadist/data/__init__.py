"""metadist.data."""
