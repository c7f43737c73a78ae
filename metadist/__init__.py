"""metadist: meta-learning across many related time series, on PyTorch 2.x.

Subpackages are imported on use so that `import metadist` stays cheap and so that
low layers (store, tasks) never pull in higher ones (learners, train).
"""

__version__ = "0.1.0"
