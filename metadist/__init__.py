"""metadist: meta-learning across many related time series, on PyTorch 2.x.

From Python (a notebook, a script), the whole path is four names:

    import metadist

    metadist.ingest("panel.parquet", "store", entity_col="id", time_col="t",
                    features=["load"], targets=["load"])        # as `metadist ingest`
    run = metadist.fit("synthetic_maml", ["data.store=store"], run_dir="runs/demo")
    run = metadist.load_run("runs/demo")                          # a run trained earlier
    forecasts = run.forecast(history).to_pandas()

Subpackages are imported on use so that `import metadist` stays cheap (no torch) and so
that low layers (store, tasks) never pull in higher ones (learners, train): the names
above are looked up when first used. `metadist.fit` is the function; `metadist.train` is
the training subpackage (`from metadist.train import load_config, train`).
"""

__version__ = "0.1.0"

__all__ = ["__version__", "fit", "ingest", "load_run"]

# name -> the module it lives in, imported on first use
_LAZY = {
    "fit": "metadist.api.fit",  # torch
    "ingest": "metadist.store.ingest",  # numpy and pyarrow only
    "load_run": "metadist.api.run",  # torch
}


def __getattr__(name: str):
    # `metadist.fit` and the others without importing torch for `import metadist`.
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'metadist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
