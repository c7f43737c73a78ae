"""metadist.models."""
