"""metadist.train."""
