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
`metadist forecast RUN_DIR NEW.parquet --out forecasts.parquet` is the command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from metadist.batch import TaskSet


def load_run(
    run_dir: str | os.PathLike,
    *,
    ensemble: Sequence[str | os.PathLike] | None = None,
    store: str | os.PathLike | None = None,
) -> Run:
    """The latest checkpoint of a training run, ready to adapt and predict.

    Args:
        run_dir: a run directory written by `metadist train`.
        ensemble: other runs of the same data and sampler to average with it (as
            `eval.ensemble`); default: the run's own evaluation settings.
        store: the series store to read the scaling rule and columns from, if it moved
            since training (default: the run's `data.store`).

    Raises:
        FileNotFoundError: no run, no checkpoint, or no store.
        ValueError: a run whose store no longer matches its checkpoint.
    """
    from metadist.eval.run import load_trained

    try:
        return Run(*load_trained(Path(run_dir), ensemble=ensemble, store=store))
    except FileNotFoundError as error:
        if store is not None or not str(error).startswith("data.store"):
            raise
        # A relative data.store is relative to where the run was trained.
        raise FileNotFoundError(
            f"{error}; run_dir {run_dir} reads the store its config names (relative paths "
            "from where it was trained): pass store=PATH (metadist forecast --store PATH) "
            "if it is elsewhere"
        ) from None


@dataclass
class Run:
    """A trained run (what `load_run` returns).

    Attributes:
        run_dir: where it lives.
        config: its `TrainConfig`.
        learner: the meta-trained learner (an ensemble with `ensemble`), in eval mode.
        source: its store, sampler and shapes (`metadist.train.build.TaskSource`).
        eval_options: its evaluation settings (`EvalOptions`): adaptation steps, seasonal
            periods of the baselines.
    """

    run_dir: Path
    config: Any
    learner: Any
    source: Any
    eval_options: Any

    @property
    def kind(self) -> str:
        """`forecast` for forecasting runs on a store, `classification` for few-shot
        classifiers, `other` for anything else (e.g. sinusoid regression)."""
        if getattr(self.learner, "loss", "mse") == "cross_entropy":
            return "classification"
        if hasattr(self.source.sampler, "horizon") and self.source.store is not None:
            return "forecast"
        return "other"

    # ------------------------------------------------------------------ forecasting
    def forecast(
        self,
        history: Any,
        *,
        horizon: int | None = None,
        methods: Sequence[str] = ("adapted",),
        period: int | None = None,
        steps: int | None = None,
    ) -> Any:
        """Forecasts of the next `horizon` steps of every entity in `history`.

        Args:
            history: the entities' history in long format: a pandas DataFrame, a pyarrow
                Table, a mapping of column name to values, or the path of a Parquet file or
                directory.
                It needs the store's entity and time columns and every value column the
                run reads or forecasts.
            horizon: steps to forecast (default: the run's H). Longer than H only where
                the model reads exactly the columns it forecasts (forecasts are fed back).
            methods: what to forecast with: `adapted` (adapted on the entity's own
                windows), `unadapted`, `naive`, `seasonal_naive`, `theta`, or a
                combination such as `adapted+theta` (the mean of those forecasts, as
                `eval.combinations` scores it).
            period: the seasonal period m of `seasonal_naive` and `theta` (default: the
                run's `eval.seasonal_period`; a mapping by stratum or label is looked up
                with the entity's stratum or label column, where the history has it).
            steps: adaptation steps (default: the run's evaluation setting, else the
                learner's `eval_inner_steps`).

        Returns:
            A pyarrow Table in long format, one row per entity, step and method: the
            entity column, `step` (1..horizon), the time column (the last time plus `step` times the history's regular spacing,
            where it is regular), `method`, and one column per forecast target in the
            entity's original units.

        Raises:
            ValueError: a missing column, a duplicated time, a non-finite value the store's
                NaN rule does not allow, a history too short for the run's windows, an
                unknown method, or a run that does not forecast; the message names it.
        """
        import pyarrow as pa

        if self.kind != "forecast":
            raise ValueError(
                f"run {self.run_dir} is a {self.kind} run; forecast() needs a forecasting "
                "run (a forecast sampler on a series store)"
            )
        sampler, store = self.source.sampler, self.source.store
        big_h = int(sampler.horizon)
        horizon = big_h if horizon is None else int(horizon)
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        wanted = _check_methods(methods)
        entities = _read_history(history, store)
        scaled = [_scale(store, e) for e in entities]
        batch = _forecast_batch(sampler, scaled, horizon)
        forecasts: dict[str, np.ndarray] = {}
        model_methods: list[str] = [m for m in ("adapted", "unadapted") if m in wanted]
        if model_methods:
            forecasts.update(self._model_forecasts(batch, model_methods, steps))
        target_columns = list(sampler.target_columns)
        for method, values in list(forecasts.items()):
            forecasts[method] = np.stack(
                [
                    _unscale(store, scaled[b], values[b], target_columns)
                    for b in range(len(entities))
                ]
            )
        baseline_methods: list[str] = [
            m for m in ("naive", "seasonal_naive", "theta") if m in wanted
        ]
        if baseline_methods:
            forecasts.update(
                self._baseline_forecasts(
                    entities, target_columns, horizon, baseline_methods, period
                )
            )
        for method in methods:
            if "+" in method:
                forecasts[method] = np.mean([forecasts[m] for m in method.split("+")], axis=0)
        return pa.table(
            _forecast_columns(store, entities, target_columns, horizon, methods, forecasts)
        )

    def _model_forecasts(
        self, batch: Any, methods: list[str], steps: int | None
    ) -> dict[str, np.ndarray]:
        from metadist.eval.scoring import _forecast

        learner = self.learner
        learner.eval()
        parameter = next(learner.parameters(), None)
        if parameter is not None:
            batch = batch.to(parameter.device)
        if steps is None:
            steps = self.eval_options.inner_steps
        out = {}
        with torch.no_grad():
            for method in methods:
                params = learner.adapt(batch.support, steps=steps if method == "adapted" else 0)
                prediction = _forecast(_predictor(learner, params), batch)
                out[method] = prediction[:, 0].double().cpu().numpy()  # [B, horizon, T]
        return out

    def _baseline_forecasts(
        self,
        entities: list[_Entity],
        target_columns: list[int],
        horizon: int,
        methods: list[str],
        period: int | None,
    ) -> dict[str, np.ndarray]:
        from metadist.eval import baselines

        options = self.eval_options
        needs_period = sorted({"seasonal_naive", "theta"} & set(methods))
        out: dict[str, list[np.ndarray]] = {m: [] for m in methods}
        for entity in entities:
            history = entity.values[:, target_columns]
            m = period
            if m is None and needs_period:
                keyed_by = options.seasonal_period_from
                known = entity.stratum if keyed_by == "stratum" else entity.label
                if isinstance(options.seasonal_period, dict) and not known:
                    raise ValueError(
                        f"{needs_period[0]} needs the seasonal period of entity "
                        f"{entity.key!r}: the run's eval.seasonal_period is a mapping by "
                        f"{keyed_by}, which the history does not hold; pass period=M"
                    )
                m = options.period_of(entity.stratum, entity.label)
            if "naive" in methods:
                out["naive"].append(baselines.naive_forecast(history, horizon))
            if "seasonal_naive" in methods:
                out["seasonal_naive"].append(
                    baselines.seasonal_naive_forecast(history, horizon, int(m or 1))
                )
            if "theta" in methods:
                out["theta"].append(baselines.theta_forecast(history, horizon, int(m or 1)))
        return {m: np.stack(v).astype(np.float64) for m, v in out.items()}

    # --------------------------------------------------------------- classification
    def classify(
        self,
        support_x: Any,
        support_labels: Sequence[Any],
        query_x: Any,
        *,
        steps: int | None = None,
    ) -> np.ndarray:
        """Labels of `query_x`, learned from a few labelled examples of new classes.

        Args:
            support_x: the labelled examples: a list of `[T, F]` (or `[T]`) arrays of the
                store's columns in original units, or one `[N, T, F]` array.
            support_labels: their labels (any hashable values; at least two classes).
            query_x: the examples to label, in the same form.
            steps: adaptation steps (default: the run's evaluation setting).

        Returns:
            `[M]` array of the predicted labels (values of `support_labels`).

        Raises:
            ValueError: a run that does not classify, mismatched lengths, fewer than two
                classes, or examples too short for the run's windows.
        """
        if self.kind != "classification":
            raise ValueError(f"run {self.run_dir} is a {self.kind} run, not a classifier")
        support = _examples(self.source, support_x, "support_x")
        query = _examples(self.source, query_x, "query_x")
        labels = list(support_labels)
        if len(labels) != len(support):
            raise ValueError(
                f"support_labels has {len(labels)} labels for {len(support)} support examples"
            )
        classes = sorted(set(labels), key=str)
        if len(classes) < 2:
            raise ValueError(f"classify needs at least two classes, got {classes}")
        codes = torch.tensor([classes.index(label) for label in labels], dtype=torch.int64)
        learner = self.learner
        learner.eval()
        device = next(learner.parameters()).device
        support_set = TaskSet(torch.from_numpy(support)[None].to(device), codes[None].to(device))
        if steps is None:
            steps = self.eval_options.inner_steps
        with torch.no_grad():
            params = learner.adapt(support_set, steps=steps)
            logits = learner.predict(params, torch.from_numpy(query)[None].to(device))
        predicted = logits[0, :, : len(classes)].argmax(-1).cpu().numpy()
        return np.asarray([classes[i] for i in predicted], dtype=object)


def _predictor(learner: Any, params: Any) -> Any:
    def predict(x: torch.Tensor) -> torch.Tensor:
        return learner.predict(params, x)

    return predict


# ---------------------------------------------------------------------- reading history
@dataclass
class _Entity:
    key: str
    times: np.ndarray  # [m] int64
    values: np.ndarray  # [m, C] float64, original units, NaN rule applied
    stratum: str = ""  # from the store's stratum and label columns, where the history has them
    label: str = ""
    scaled: np.ndarray | None = None  # [m, C] float32
    mean: np.ndarray | None = None  # [C] per-entity statistics (per-entity scaling)
    std: np.ndarray | None = None


def _read_history(history: Any, store: Any) -> list[_Entity]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(history, (str, os.PathLike)):
        path = Path(history)
        if not path.exists():
            raise FileNotFoundError(f"history: no Parquet file or directory at {path}")
        table = pq.read_table(path)
    elif isinstance(history, pa.Table):
        table = history
    elif hasattr(history, "to_dict") and hasattr(history, "columns"):  # pandas
        table = pa.Table.from_pandas(history, preserve_index=False)
    elif isinstance(history, dict):
        table = pa.table(history)
    else:
        raise ValueError(
            f"history must be a pandas DataFrame, a pyarrow Table, a mapping of columns or a "
            f"Parquet path, got {type(history).__name__}"
        )
    meta = store.metadata
    entity_col, time_col = meta["entity_col"], meta["time_col"]
    value_names = list(store.column_names)
    missing = [c for c in (entity_col, time_col, *value_names) if c not in table.column_names]
    if missing:
        raise ValueError(
            f"history has no column {missing[0]!r}; the run's store needs {entity_col!r}, "
            f"{time_col!r} and {', '.join(map(repr, value_names))}"
        )
    if table.num_rows == 0:
        raise ValueError("history has no rows")
    keys = np.asarray(table.column(entity_col).to_pylist(), dtype=object).astype(str)
    times = _times(table.column(time_col), time_col)
    values = np.column_stack([_floats(table.column(name), name) for name in value_names]).astype(
        np.float64
    )
    nan_rule = str(meta.get("nan_policy", "error"))
    categories = {
        role: np.asarray(table.column(meta[f"{role}_col"]).to_pylist(), dtype=object).astype(str)
        for role in ("stratum", "label")
        if meta.get(f"{role}_col") and meta[f"{role}_col"] in table.column_names
    }
    entities = []
    order = np.lexsort((times, keys))
    keys, times, values = keys[order], times[order], values[order]
    categories = {role: codes[order] for role, codes in categories.items()}
    boundaries = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    for first, end in zip(
        np.concatenate(([0], boundaries)), np.concatenate((boundaries, [len(keys)])), strict=True
    ):
        key = str(keys[first])
        entity_times, entity_values = times[first:end], values[first:end].copy()
        repeated = np.flatnonzero(np.diff(entity_times) == 0)
        if repeated.size:
            raise ValueError(
                f"history: entity {key!r} has two rows at {time_col}={entity_times[repeated[0]]}"
            )
        entity_values, entity_times = _apply_nan_rule(
            key, entity_values, entity_times, value_names, nan_rule
        )
        entity = _Entity(key, entity_times, entity_values)
        entity.stratum = str(categories["stratum"][first]) if "stratum" in categories else ""
        entity.label = str(categories["label"][first]) if "label" in categories else ""
        entities.append(entity)
    return entities


def _times(column: Any, name: str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        raise ValueError(f"history: column {name!r} has null times")
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("ns")).cast(pa.int64())
    elif pa.types.is_date(column.type):
        column = pc.cast(column, pa.date32()).cast(pa.int64())
    elif not pa.types.is_integer(column.type):
        raise ValueError(
            f"history: column {name!r} must hold integers, dates or timestamps, got {column.type}"
        )
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def _floats(column: Any, name: str) -> np.ndarray:
    import pyarrow as pa

    if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        raise ValueError(f"history: column {name!r} must hold numbers, got {column.type}")
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def _apply_nan_rule(
    key: str, values: np.ndarray, times: np.ndarray, names: list[str], rule: str
) -> tuple[np.ndarray, np.ndarray]:
    finite = np.isfinite(values)
    if finite.all():
        return values, times
    if rule == "drop":
        keep = finite.all(axis=1)
        return values[keep], times[keep]
    column = int(np.flatnonzero(~finite.all(axis=0))[0])
    if rule != "ffill":
        row = int(np.flatnonzero(~finite[:, column])[0])
        raise ValueError(
            f"history: entity {key!r} has {values[row, column]} in column {names[column]!r} at "
            f"time {times[row]}; the run's store was built with --nan {rule}, so the history "
            "must be finite"
        )
    if not finite.any(axis=0).all():
        empty = names[int(np.flatnonzero(~finite.any(axis=0))[0])]
        raise ValueError(f"history: entity {key!r} has no finite value in column {empty!r}")
    from metadist.store.order import fill_forward

    filled = values.copy()
    fill_forward(filled, np.zeros(1, np.int64), np.array([len(filled)], np.int64))
    return filled, times


def _scale(store: Any, entity: _Entity) -> _Entity:
    """`entity` with its values in the store's scaled units (float32, as stored)."""
    from metadist.store.scaler import scale_of

    scaler = store.scaler
    values = entity.values
    if scaler.kind == "none":
        entity.scaled = values.astype(np.float32)
        return entity
    if scaler.kind == "global":
        mean, std = scaler.mean, scaler.std
    else:  # per-entity: the entity's own statistics, as ingest computes them
        finite = np.isfinite(values)
        count = finite.sum(axis=0).astype(np.float64)
        mean = np.where(finite, values, 0.0).sum(axis=0) / np.maximum(count, 1)
        m2 = (np.where(finite, values - mean, 0.0) ** 2).sum(axis=0)
        std = scale_of(count, m2)
    entity.mean, entity.std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    entity.scaled = ((values - entity.mean) / entity.std).astype(np.float32)
    return entity


def _unscale(store: Any, entity: _Entity, values: np.ndarray, columns: list[int]) -> np.ndarray:
    if store.scaler.kind == "none":
        return values
    assert entity.mean is not None and entity.std is not None
    return values * entity.std[columns] + entity.mean[columns]


def _forecast_batch(sampler: Any, entities: list[_Entity], horizon: int) -> Any:
    """The evaluation's task for each entity, with its query window past the history's
    end: support windows ending at the history's end, query input its last L rows."""
    from metadist.batch import MetaBatch
    from metadist.tasks.windows import WindowGatherer

    big_l, big_h = int(sampler.lookback), int(sampler.horizon)
    k, s, pad = int(sampler.num_support), int(sampler.stride), int(sampler.pad_inputs)
    needed = big_l + big_h + (k - 1) * s - pad
    support_x, support_y, query_x = [], [], []
    for entity in entities:
        assert entity.scaled is not None
        m = len(entity.scaled)
        if m < max(needed, 1) or m < big_l - pad:
            raise ValueError(
                f"history: entity {entity.key!r} has {m} rows; the run adapts on {k} windows "
                f"of {big_l} + {big_h} rows (stride {s}, up to {pad} padded), so it needs at "
                f"least {needed}"
            )
        inputs = WindowGatherer(entity.scaled, sampler.input_columns, big_l)
        targets = WindowGatherer(entity.scaled, sampler.target_columns, big_h)
        starts = (m - big_l - big_h) - (k - 1 - np.arange(k)) * s
        first = np.zeros(1, np.int64)
        support_x.append(inputs.gather(starts, first) if pad else inputs.gather(starts))
        support_y.append(targets.gather(starts + big_l))
        query_start = np.array([m - big_l])
        query_x.append(inputs.gather(query_start, first) if pad else inputs.gather(query_start))
    num = len(entities)
    num_targets = len(sampler.target_columns)
    return MetaBatch(
        support=TaskSet(
            torch.from_numpy(np.stack(support_x)), torch.from_numpy(np.stack(support_y))
        ),
        query=TaskSet(
            torch.from_numpy(np.stack(query_x)),
            torch.zeros(num, 1, horizon, num_targets),  # unknown: only its shape is read
        ),
        entity_index=torch.full((num,), -1, dtype=torch.int64),
        stratum=torch.zeros(num, dtype=torch.int64),
        split_time=torch.full((num,), -1, dtype=torch.int64),
    )


def _check_methods(methods: Sequence[str]) -> set[str]:
    known = {"adapted", "unadapted", "naive", "seasonal_naive", "theta"}
    if isinstance(methods, str) or not methods:
        raise ValueError(f"methods must be a non-empty list of names, got {methods!r}")
    wanted: set[str] = set()
    for method in methods:
        parts = method.split("+")
        unknown = [p for p in parts if p not in known]
        if unknown:
            raise ValueError(
                f"unknown forecast method {unknown[0]!r}; use {', '.join(sorted(known))} or a "
                "combination such as adapted+theta"
            )
        wanted.update(parts)
    return wanted


def _forecast_columns(
    store: Any,
    entities: list[_Entity],
    target_columns: list[int],
    horizon: int,
    methods: Sequence[str],
    forecasts: dict[str, np.ndarray],
) -> dict[str, Any]:
    import pyarrow as pa

    meta = store.metadata
    names = [store.column_names[c] for c in target_columns]
    columns: dict[str, list] = {meta["entity_col"]: [], "step": [], meta["time_col"]: []}
    columns["method"] = []
    for name in names:
        columns[name] = []
    for b, entity in enumerate(entities):
        spacing = np.diff(entity.times)
        regular = len(spacing) > 0 and (spacing == spacing[0]).all() and spacing[0] > 0
        for step in range(1, horizon + 1):
            for method in methods:
                columns[meta["entity_col"]].append(entity.key)
                columns["step"].append(step)
                columns[meta["time_col"]].append(
                    int(entity.times[-1] + step * spacing[0]) if regular else None
                )
                columns["method"].append(method)
                for t, name in enumerate(names):
                    columns[name].append(float(forecasts[method][b, step - 1, t]))
    out = {key: pa.array(value) for key, value in columns.items()}
    out[meta["time_col"]] = pa.array(columns[meta["time_col"]], type=pa.int64())
    return out


# ------------------------------------------------------------------- classification
def _examples(source: Any, examples: Any, field: str) -> np.ndarray:
    """`[M, L, F]` float32 examples, scaled and cut (or resampled) as the sampler does."""
    sampler, store = source.sampler, source.store
    if isinstance(examples, np.ndarray) and examples.ndim in (2, 3) and examples.dtype != object:
        items = list(examples if examples.ndim == 3 else examples[None])
    else:
        items = [np.asarray(e, dtype=np.float64) for e in examples]
    if not items:
        raise ValueError(f"{field} is empty")
    columns = np.asarray(sampler.input_columns, dtype=np.int64)
    num_columns = len(store.column_names)
    length = int(sampler.lookback)
    out = []
    for i, item in enumerate(items):
        item = np.asarray(item, dtype=np.float64)
        if item.ndim == 1:
            item = item[:, None]
        if item.shape[1] != num_columns:
            raise ValueError(
                f"{field}[{i}] has {item.shape[1]} columns; the run's store has {num_columns} "
                f"({', '.join(store.column_names)})"
            )
        if not np.isfinite(item).all():
            raise ValueError(f"{field}[{i}] has NaN or infinite values")
        entity = _scale(store, _Entity(str(i), np.arange(len(item)), item))
        assert entity.scaled is not None
        scaled = entity.scaled[:, columns]
        if getattr(sampler, "resample", False):
            scaled = _resample(scaled, length)
        elif len(scaled) < length:
            raise ValueError(f"{field}[{i}] has {len(scaled)} rows; the run reads {length}")
        else:
            scaled = scaled[-length:]
        out.append(scaled)
    return np.ascontiguousarray(np.stack(out), dtype=np.float32)


def _resample(series: np.ndarray, length: int) -> np.ndarray:
    """`series` linearly resampled to `length` rows (as the N-way sampler does)."""
    n = len(series)
    position = np.arange(length, dtype=np.float64) / max(length - 1, 1) * (n - 1)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    weight = (position - low)[:, None].astype(np.float32)
    return series[low] * (1 - weight) + series[high] * weight


# ------------------------------------------------------------------------ command
def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Adds `metadist forecast RUN_DIR HISTORY.parquet --out FORECASTS.parquet`."""
    parser = subparsers.add_parser(
        "forecast",
        help="forecast new entities from their own history with a trained run",
        description=(
            "Adapt a trained run on each entity's own history (long format, as ingest "
            "takes it) and write its forecasts in original units."
        ),
    )
    parser.add_argument("run_dir", help="a run directory written by metadist train")
    parser.add_argument("history", help="Parquet file of the new entities' history")
    parser.add_argument("--out", required=True, help="where to write the forecasts (Parquet)")
    parser.add_argument("--horizon", type=int, default=None, help="steps (default: the run's)")
    parser.add_argument(
        "--methods",
        default="adapted",
        help="comma-separated: adapted, unadapted, naive, seasonal_naive, theta, or "
        "combinations such as adapted+theta (default: adapted)",
    )
    parser.add_argument("--period", type=int, default=None, help="seasonal period m")
    parser.add_argument(
        "--ensemble", nargs="*", default=None, help="other run directories to average with"
    )
    parser.add_argument(
        "--store",
        default=None,
        help="the run's series store, if it is not where the run's data.store says",
    )
    parser.set_defaults(func=_run_cli)


def _run_cli(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    from metadist.durable import atomic_file

    run = load_run(args.run_dir, ensemble=args.ensemble, store=args.store)
    table = run.forecast(
        args.history,
        horizon=args.horizon,
        methods=[m.strip() for m in args.methods.split(",") if m.strip()],
        period=args.period,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as temporary:
        pq.write_table(table, temporary)
    entities = len(set(table.column(0).to_pylist()))
    print(
        f"forecasts of {entities} {'entity' if entities == 1 else 'entities'} written to {out}",
        file=sys.stderr,
    )
    return 0
