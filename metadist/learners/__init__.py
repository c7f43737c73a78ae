"""metadist.learners."""
