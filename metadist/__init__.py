"""metadist: meta-learning across many related time series, on PyTorch 2.x.

Subpackages are imported on use so that `import metadist` stays cheap and so that
low layers (store, tasks) never pull in higher ones (learners, train).
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load_run"]


def __getattr__(name: str):
    # `metadist.load_run` without importing torch for `import metadist`.
    if name == "load_run":
        from metadist.api import load_run

        return load_run
    raise AttributeError(f"module 'metadist' has no attribute {name!r}")
