"""Use a trained run: adapt it to new entities from their own history, then forecast.

    import metadist

    run = metadist.load_run("runs/synthetic_maml")
    forecasts = run.forecast(history)            # a long-format frame of new entities
    labels = run.classify(support_x, support_labels, query_x)   # a few-shot classifier

`history` has the long format `metadist ingest` takes: one row per (entity, time), the
store's entity and time columns and its value columns (features and targets). The new
entities need not be in the store. Each one is scaled by the store's rule (per-entity
statistics come from its own history), adapted on support windows cut from its own
history exactly as evaluation cuts them (`split="end"`: the last windows that end where
the history ends), and its next H steps are forecast in its original units.
`metadist forecast RUN_DIR NEW.parquet --out forecasts.parquet` is the command line
(`metadist.commands.forecast`).

One idea per module: `run` (`load_run`, `Run`), `history` (reading and scaling a
history), `forecasting` and `classification` (the two paths), `protocols` (what `Run`
needs of a run's learner and sampler).
"""

from metadist.api.run import Run, load_run

__all__ = ["Run", "load_run"]
