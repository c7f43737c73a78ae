"""metadist.store."""
