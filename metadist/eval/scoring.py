"""The scoring engine: adapt on each task's support set, score its query next to baselines.

`evaluate_tasks` scores, on the same tasks, the meta-trained model after adaptation and
without it, the same network trained from scratch on the support set, and (for
forecasting on a store) the naive, seasonal-naive and Theta forecasts, all in the store's
original units, plus any forecast combinations asked for (`eval.combinations`). A
prediction that diverges is counted as such, never averaged in (`TaskScores`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from metadist.batch import MetaBatch
from metadist.eval import baselines, metrics
from metadist.eval.settings import (
    CLASSIFICATION_METHODS,
    CLASSIFICATION_METRICS,
    DERIVED_METRICS,
    FORECAST_METHODS,
    FORECAST_METRICS,
    MODEL_METHODS,
    REGRESSION_METRICS,
    EvalOptions,
    combination_key,
    combination_label,
)
from metadist.progress import Progress

_DIVERGED = "diverged"
# A prediction diverged when it is not finite, or larger in magnitude than this many times
# the largest value the method was given for the task (its history or support targets):
# an exploding inner loop, not a forecast.
DIVERGENCE_FACTOR = 1e6


def diverged(prediction: np.ndarray, reference: np.ndarray | float) -> bool:
    """Whether one task's `prediction` is non-finite or exploding relative to
    `reference` (the values the method saw: history or support targets)."""
    prediction = np.asarray(prediction, dtype=np.float64)
    if not np.isfinite(prediction).all():
        return True
    scale = float(np.nanmax(np.abs(reference))) if np.size(reference) else 0.0
    return bool(np.abs(prediction).max(initial=0.0) > DIVERGENCE_FACTOR * max(scale, 1e-12))


class TaskScores:
    """Per-task point sums of each metric, for each method, and the tasks' groups
    (`table` / `from_table`: one row per task, as `tasks.parquet` holds them)."""

    def __init__(self, methods: Iterable[str], metric_names: Iterable[str]) -> None:
        self.methods = list(methods)
        self.metric_names = list(metric_names)
        self.sums: dict[str, dict[str, list[float]]] = {
            m: {k: [] for k in self.metric_names} for m in self.methods
        }
        self.diverged: dict[str, list[bool]] = {m: [] for m in self.methods}
        self.counts: list[int] = []
        self.groups: dict[str, list[str]] = {}
        # Every forecast point (forecasting on a store): entity, groups, step, target,
        # truth and each method's forecast, one row each (`forecasts.parquet`).
        self.points: dict[str, list] = {}

    def add_points(
        self,
        groups: dict[str, str],
        truth: np.ndarray,
        forecasts: dict[str, np.ndarray],
    ) -> None:
        """Records one task's forecast points: `truth [h, T]`, `forecasts {method: [h, T]}`."""
        h, num_targets = truth.shape
        columns = {
            **{name: [value] * truth.size for name, value in groups.items()},
            "step": np.repeat(np.arange(h), num_targets).tolist(),
            "target": np.tile(np.arange(num_targets), h).tolist(),
            "truth": truth.reshape(-1).tolist(),
            **{m: np.asarray(forecasts[m], np.float64).reshape(-1).tolist() for m in self.methods},
        }
        for name, values in columns.items():
            self.points.setdefault(name, []).extend(values)

    def add(
        self,
        sums: dict[str, dict[str, float]],
        count: int,
        groups: dict[str, str],
        diverged: dict[str, bool] | None = None,
    ):
        """Adds one task: each method's metric sums over its `count` points, its groups,
        and which methods diverged on it (their sums are then not used)."""
        for method in self.methods:
            failed = bool((diverged or {}).get(method, False))
            self.diverged[method].append(failed)
            for name in self.metric_names:
                self.sums[method][name].append(float("nan") if failed else sums[method][name])
        self.counts.append(count)
        for grouping, value in groups.items():
            self.groups.setdefault(grouping, []).append(value)

    @property
    def num_tasks(self) -> int:
        return len(self.counts)

    def table(self, groupings: dict[str, str]) -> dict[str, list]:
        """Columns of one row per task: `num_points`, `group:<name>` for each grouping
        (`{grouping: name}`), and `<method>:<metric>` point sums; see `from_table`."""
        columns: dict[str, list] = {"num_points": list(self.counts)}
        for grouping, name in groupings.items():
            if grouping in self.groups:
                columns[f"group:{name}"] = list(self.groups[grouping])
        for method in self.methods:
            for metric in self.metric_names:
                columns[f"{method}:{metric}"] = list(self.sums[method][metric])
            columns[f"{method}:{_DIVERGED}"] = list(self.diverged[method])
        return columns

    @classmethod
    def from_table(cls, columns: dict[str, list]) -> TaskScores:
        """The scores of a `table`, its groups keyed by their names."""
        pairs = [
            key.split(":", 1) for key in columns if ":" in key and not key.startswith("group:")
        ]
        methods = list(dict.fromkeys(method for method, _ in pairs))
        scores = cls(methods, dict.fromkeys(metric for _, metric in pairs if metric != _DIVERGED))
        for method, metric in pairs:
            if metric == _DIVERGED:
                scores.diverged[method] = [bool(v) for v in columns[f"{method}:{metric}"]]
            else:
                scores.sums[method][metric] = [float(v) for v in columns[f"{method}:{metric}"]]
        scores.counts = [int(v) for v in columns["num_points"]]
        for method in methods:  # tables written before divergence was recorded
            if len(scores.diverged[method]) != len(scores.counts):
                scores.diverged[method] = [False] * len(scores.counts)
        scores.groups = {
            key[len("group:") :]: [str(v) for v in values]
            for key, values in columns.items()
            if key.startswith("group:")
        }
        return scores

    def summary(self, keep: np.ndarray | None = None) -> dict[str, dict[str, dict[str, float]]]:
        counts = np.asarray(self.counts, dtype=np.float64)
        keep = np.ones(len(counts), dtype=bool) if keep is None else keep
        out: dict[str, dict[str, dict[str, float]]] = {}
        for method in self.methods:
            out[method] = {}
            num_diverged = int(np.asarray(self.diverged[method], dtype=bool)[keep].sum())
            for name in self.metric_names:
                if num_diverged:
                    # Not averaged over the other tasks: that number would not be
                    # comparable with the other methods' (nor finite with them in it).
                    out[method][name] = {
                        "value": float("nan"),
                        "task_mean": float("nan"),
                        "ci95": float("nan"),
                        "num_tasks": int(keep.sum()),
                        "num_diverged": num_diverged,
                    }
                    continue
                sums = np.asarray(self.sums[method][name], dtype=np.float64)[keep]
                per_task = sums / counts[keep]
                finite = per_task[~np.isnan(per_task)]
                value = metrics.pool(sums, counts[keep])
                half = metrics.mean_ci(finite)[1] if finite.size else float("nan")
                out[method][name] = {
                    "value": value,
                    "task_mean": float(finite.mean()) if finite.size else float("nan"),
                    "ci95": half,
                    "num_tasks": int(finite.size),
                    "num_diverged": 0,
                }
        if self.has_owa:
            for method in self.methods:
                out[method]["owa"] = _owa(out[method], out["naive2"])
        return out

    @property
    def has_owa(self) -> bool:
        """Whether OWA can be derived: naive 2 scored, with sMAPE and MASE."""
        return "naive2" in self.methods and {"smape", "mase"} <= set(self.metric_names)

    def num_diverged(self) -> dict[str, int]:
        """`{method: tasks on which it diverged}`, for the methods that did."""
        counts = {m: int(sum(flags)) for m, flags in self.diverged.items()}
        return {m: n for m, n in counts.items() if n}


def _owa(scores: dict[str, dict[str, float]], naive2: dict[str, dict[str, float]]) -> dict:
    """OWA (M4): ½·(sMAPE / sMAPE of naive 2 + MASE / MASE of naive 2), of the pooled
    values, and of the per-series means; not finite where either ratio is undefined."""
    out: dict[str, Any] = {"ci95": None, "num_tasks": scores["smape"]["num_tasks"]}
    out["num_diverged"] = scores["smape"]["num_diverged"]
    for key in ("value", "task_mean"):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = 0.5 * (
                np.float64(scores["smape"][key]) / naive2["smape"][key]
                + np.float64(scores["mase"][key]) / naive2["mase"][key]
            )
        out[key] = float(ratio) if np.isfinite(ratio) else float("nan")
    return out


def evaluate_tasks(
    learner: nn.Module,
    batches: Iterable[MetaBatch],
    *,
    options: EvalOptions,
    store: Any = None,
    target_columns: list[int] | None = None,
    fresh_model: Callable[[], nn.Module] | None = None,
    progress: bool | None = False,
    num_tasks: int | None = None,
    pretrained: nn.Module | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Scores every method on every task of `batches`.

    Args:
        learner: a trained learner (`adapt(support, steps)`, `predict(params, x)`,
            `.model`, `.loss`).
        batches: the held-out tasks. Forecasting on a store: `support.x [B, K, L, F]`,
            `support.y [B, K, H, T]`, one query window per task (`query.y [B, 1, H, T]`,
            the last H steps after `split_time`). Regression: `[B, Q, T]` targets.
            Classification (`learner.loss == "cross_entropy"`): `query.y [B, N]`.
        options: evaluation settings.
        store: the `SeriesStore` the tasks come from; with it, forecasts are scored in
            original units and the naive baselines are added.
        target_columns: store column index of each of the T targets.
        fresh_model: builds a freshly initialised model of the same architecture for the
            from-scratch baseline; `None` (or `options.scratch_steps == 0`) leaves that
            baseline out.
        progress: show tasks done (`metadist.progress`: `None` also shows it, as a bar on a
            terminal, else a line every 15 s; `False` shows nothing).
        num_tasks: tasks expected, for the progress display.
        pretrained: classification only: a backbone pretrained as an ordinary classifier
            of the meta-train classes (`baselines.pretrain_embedding`), scored as the
            "pretrained" baseline; `None` leaves it out. Classification always scores the
            nearest-centroid and 1-NN baselines on the raw examples.

    Returns:
        (result, examples): the result dict that `report.write_report` writes, and up to
        `options.num_examples` forecasts for the figure.

    Raises:
        ValueError: a batch that does not fit the protocol (several query windows with a
            store, missing target columns), or bad options.
    """
    options.validate()
    classification = getattr(learner, "loss", "mse") == "cross_entropy"
    with_store = store is not None and not classification
    if with_store and target_columns is None:
        raise ValueError("evaluate_tasks: a store needs target_columns (the store columns of T)")
    if options.scratch_steps == 0:
        fresh_model = None  # with no steps, that row would be an untrained network
    methods = [m for m in MODEL_METHODS if m != "scratch" or fresh_model is not None]
    if not getattr(learner, "has_inner_loop", True):
        methods.remove("unadapted")  # nothing to compare adaptation with
    if classification:
        methods += ["nearest_centroid", "one_nn"] + (["pretrained"] if pretrained else [])
    combinations = [list(c) for c in options.combinations or []]
    if combinations and not with_store:
        raise ValueError(
            "eval.combinations averages forecasts in original units, so it needs forecast "
            "tasks on a store; set it to null for this experiment"
        )
    metric_names: tuple[str, ...]
    if with_store:
        methods += ["naive", "seasonal_naive", "naive2", "theta", *options.extra_baselines]
        for combination in combinations:
            missing = [m for m in combination if m not in methods]
            if missing:
                raise ValueError(
                    f"eval.combinations: {combination} needs {missing[0]!r}, which this "
                    "evaluation does not score (there is no from-scratch baseline for an "
                    "embedding model or with eval.scratch_steps=0)"
                )
        methods += [combination_key(c) for c in combinations]
        metric_names = FORECAST_METRICS
    else:
        metric_names = CLASSIFICATION_METRICS if classification else REGRESSION_METRICS
    scores = TaskScores(methods, metric_names)
    # Forecasts for the figure: tasks of a stratum or label not drawn yet, then others.
    examples: list[dict[str, Any]] = []
    spare: list[dict[str, Any]] = []
    example_groups: set[str] = set()
    scratch_template = None
    started = time.perf_counter()
    was_training = learner.training
    learner.eval()
    if options.max_tasks is not None:
        num_tasks = min(num_tasks or options.max_tasks, options.max_tasks)
    display = Progress(progress, transient=True).__enter__()
    shown = display.counter("evaluating", num_tasks, "tasks")
    try:
        for batch in batches:
            if options.max_tasks is not None and scores.num_tasks >= options.max_tasks:
                break
            if options.max_tasks is not None:
                batch = batch.select(slice(0, options.max_tasks - scores.num_tasks))
            predictions = _model_predictions(learner, batch, options, "unadapted" in methods)
            if classification:
                predictions.update(_classification_baselines(batch, pretrained))
            if fresh_model is not None:
                if scratch_template is None:
                    with torch.random.fork_rng(devices=[]):
                        torch.manual_seed(options.seed)
                        scratch_template = fresh_model()
                params = baselines.fit_from_scratch(
                    scratch_template,
                    batch.support.x,
                    batch.support.y,
                    steps=options.scratch_steps,
                    lr=options.scratch_lr,
                    loss=getattr(learner, "loss", "mse"),
                )
                predictions["scratch"] = _forecast(
                    _stacked_predictor(scratch_template, params), batch
                )
            arrays = {k: v.detach().cpu().numpy() for k, v in predictions.items()}
            if classification:
                _score_classification(scores, batch, arrays, store)
            elif with_store:
                _score_forecasts(
                    scores,
                    batch,
                    arrays,
                    store,
                    target_columns,
                    options,
                    examples,
                    spare,
                    example_groups,
                )
            else:
                _score_regression(scores, batch, arrays)
            shown.update(scores.num_tasks)
    finally:
        display.close()
        learner.train(was_training)
    if scores.num_tasks == 0:
        raise ValueError("evaluate_tasks: no task to evaluate (the held-out split is empty)")
    result = _result(scores, classification, with_store, options, learner)
    result["diverged"] = scores.num_diverged()
    for method, count in result["diverged"].items():
        print(
            f"warning: {result['methods'][method]} diverged on {count} of {scores.num_tasks} "
            "tasks (non-finite or exploding predictions); reported as diverged, not averaged",
            file=sys.stderr,
        )
    result["settings"]["seconds"] = round(time.perf_counter() - started, 2)
    return result, (examples + spare)[: options.num_examples]


def _stacked_predictor(model: nn.Module, params: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """`x -> predictions` of `model` with the per-task parameters `params`."""

    def predict(x: torch.Tensor) -> torch.Tensor:
        return baselines.predict_stacked(model, params, x)

    return predict


def _model_predictions(
    learner, batch: MetaBatch, options: EvalOptions, unadapted: bool = True
) -> dict[str, torch.Tensor]:
    parameter = next(learner.parameters(), None)  # on the run's device (trainer.device)
    if parameter is not None:
        batch = batch.to(parameter.device, non_blocking=True)
    with torch.no_grad():
        adapted = learner.adapt(batch.support, steps=options.inner_steps)
        out = {"adapted": _forecast(lambda x: learner.predict(adapted, x), batch)}
        if unadapted:
            before = learner.adapt(batch.support, steps=0)
            out["unadapted"] = _forecast(lambda x: learner.predict(before, x), batch)
        return out


def _classification_baselines(
    batch: MetaBatch, pretrained: nn.Module | None
) -> dict[str, torch.Tensor]:
    """Scores `[B, Q, N]` of the non-meta-learned classifiers on the batch's episodes."""
    support_x, support_y, query_x = batch.support.x, batch.support.y, batch.query.x
    num_ways = int(support_y.max()) + 1
    out = {
        "nearest_centroid": baselines.nearest_centroid_scores(
            support_x, support_y, query_x, num_ways
        ),
        "one_nn": baselines.one_nn_scores(support_x, support_y, query_x, num_ways),
    }
    if pretrained is not None:
        out["pretrained"] = baselines.embedding_centroid_scores(
            pretrained, support_x, support_y, query_x, num_ways
        )
    return out


def _forecast(predict: Callable[[torch.Tensor], torch.Tensor], batch: MetaBatch) -> torch.Tensor:
    """Predictions for `batch.query.x`, rolled forward when the query horizon is longer.

    A model predicting H' steps forecasts a longer query horizon H by feeding its own
    forecasts back as inputs, H' steps at a time (the inputs must then be the targets:
    `query.x [B, Q, L, T]`).
    """
    x = batch.query.x
    target = batch.query.y
    prediction = predict(x)
    if target.dim() != 4 or prediction.dim() != 4 or prediction.shape[2] >= target.shape[2]:
        return prediction if target.dim() != 4 else prediction[:, :, : target.shape[2]]
    if x.shape[-1] != prediction.shape[-1]:
        raise ValueError(
            f"the query horizon {target.shape[2]} is longer than the model's horizon "
            f"{prediction.shape[2]}, and rolling forecasts forward needs the inputs to be the "
            f"targets, but the model reads {x.shape[-1]} input columns and predicts "
            f"{prediction.shape[-1]}"
        )
    pieces = [prediction]
    done = prediction.shape[2]
    lookback = x.shape[2]
    while done < target.shape[2]:
        x = torch.cat([x, pieces[-1]], dim=2)[:, :, -lookback:]
        pieces.append(predict(x))
        done += pieces[-1].shape[2]
    return torch.cat(pieces, dim=2)[:, :, : target.shape[2]]


def _score_forecasts(
    scores, batch, predictions, store, target_columns, options, examples, spare, seen
):
    query_y = batch.query.y
    if query_y.dim() != 4 or query_y.shape[1] != 1:
        raise ValueError(
            "forecast evaluation scores one query window per task (the last H steps of the "
            f"entity, split='end'); got query.y of shape {tuple(query_y.shape)} — set the "
            "sampler's num_query to 1"
        )
    entity_index = batch.entity_index.cpu().numpy()
    split_time = batch.split_time.cpu().numpy()
    scaler = store.scaler
    cols = list(target_columns)
    index = entity_index[:, None, None]
    truth = scaler.inverse(query_y.cpu().numpy().astype(np.float64), index, cols)[:, 0]
    model_forecasts = {
        k: scaler.inverse(v.astype(np.float64), index, cols)[:, 0] for k, v in predictions.items()
    }
    stratum_names = store.stratum_names
    label_names = store.label_names
    for b, entity in enumerate(entity_index):
        times = store.series_times(int(entity))
        num_history = int(np.searchsorted(times, split_time[b], side="left"))
        scaled_history = np.asarray(store.series(int(entity))[:num_history][:, cols], np.float64)
        history = scaler.inverse(scaled_history, int(entity), cols)
        stratum = str(stratum_names[store.stratum_codes[entity]]) if len(stratum_names) else ""
        label = str(label_names[store.label_codes[entity]]) if len(label_names) else ""
        period = options.period_of(stratum, label)
        horizon = truth.shape[1]
        forecasts = {k: v[b] for k, v in model_forecasts.items()}
        forecasts["naive"] = baselines.naive_forecast(history, horizon)
        forecasts["seasonal_naive"] = baselines.seasonal_naive_forecast(history, horizon, period)
        forecasts["naive2"] = baselines.naive2_forecast(history, horizon, period)
        forecasts["theta"] = baselines.theta_forecast(history, horizon, period)
        if "ets" in scores.methods:
            forecasts["ets"] = baselines.ets_forecast(history, horizon, period)
        for combination in options.combinations or []:
            forecasts[combination_key(combination)] = np.mean(
                [forecasts[m] for m in combination], axis=0
            )
        try:
            scale = np.asarray(metrics.seasonal_scale(history, period), dtype=np.float64)
        except ValueError:  # history no longer than one season: MASE undefined
            scale = np.full(len(cols), np.nan)
        sums = {}
        failed = {m: diverged(forecasts[m], history) for m in scores.methods}
        for method in scores.methods:
            forecast = forecasts[method]
            abs_err = metrics.absolute_errors(truth[b], forecast)
            with np.errstate(divide="ignore", invalid="ignore"):
                scaled = np.where(scale > 0, abs_err / scale, np.nan)
            sums[method] = {
                "smape": float(metrics.smape_terms(truth[b], forecast).sum()),
                "mape": float(metrics.ape_terms(truth[b], forecast).sum()),
                "mase": float(scaled.sum()),
                "mae": float(abs_err.sum()),
                "mse": float(metrics.squared_errors(truth[b], forecast).sum()),
            }
        groups = {"stratum": stratum, "label": label, "entity": str(store.entity_ids[entity])}
        scores.add(sums, truth[b].size, groups, failed)
        scores.add_points(groups, truth[b], forecasts)
        # Draw first the tasks that show a stratum or label not drawn yet, then any.
        values = {("stratum", stratum), ("label", label)}
        drawn = spare if values <= seen else examples
        if len(drawn) < options.num_examples:
            seen.update(values)
            tail = max(3 * horizon, 2 * period, 24)
            tags = ", ".join(v for v in (stratum, label) if v)
            drawn.append(
                {
                    "title": f"{store.entity_ids[entity]} ({tags})"
                    if tags
                    else str(store.entity_ids[entity]),
                    "history": history[-tail:, 0],
                    "truth": truth[b][:, 0],
                    "unadapted": forecasts["unadapted"][:, 0],
                    "adapted": forecasts["adapted"][:, 0],
                }
            )
            if options.combinations:  # the first combination joins the figure
                first = options.combinations[0]
                drawn[-1]["combination"] = forecasts[combination_key(first)][:, 0]
                drawn[-1]["combination_label"] = combination_label(first)


def _score_regression(scores, batch, predictions):
    truth = batch.query.y.cpu().numpy().astype(np.float64)
    support = batch.support.y.cpu().numpy().astype(np.float64)
    for b in range(truth.shape[0]):
        failed = {m: diverged(predictions[m][b], support[b]) for m in scores.methods}
        sums = {
            method: {
                "mse": float(metrics.squared_errors(truth[b], predictions[method][b]).sum()),
                "mae": float(metrics.absolute_errors(truth[b], predictions[method][b]).sum()),
            }
            for method in scores.methods
        }
        scores.add(sums, truth[b].size, {}, failed)


def _score_classification(scores, batch, predictions, store):
    target = batch.query.y.cpu().numpy()
    for b in range(target.shape[0]):
        sums = {
            method: {"accuracy": float((predictions[method][b].argmax(-1) == target[b]).sum())}
            for method in scores.methods
        }
        failed = {m: not np.isfinite(predictions[m][b]).all() for m in scores.methods}
        scores.add(sums, target[b].size, {}, failed)


def overall_summary(scores: TaskScores, classification: bool) -> dict[str, Any]:
    """`scores.summary()` of all tasks; accuracy (classification) is averaged over tasks."""
    overall = scores.summary()
    if classification:
        for method in scores.methods:
            score = overall[method]["accuracy"]
            score["value"] = score["task_mean"]
    return overall


def group_summaries(scores: TaskScores, groupings: dict[str, str]) -> dict[str, Any]:
    """`{name: {group value: {num_tasks, num_scored: {metric: tasks}, scores: {method:
    {metric: value}}}}}` for each
    `{grouping: name}` of `groupings` that splits the tasks into at least two groups."""
    out: dict[str, Any] = {}
    for grouping, name in groupings.items():
        if grouping not in scores.groups:
            continue
        values = np.asarray(scores.groups[grouping])
        names = sorted(set(values.tolist()) - {""})
        if len(names) < 2:
            continue
        table = {}
        for value in names:
            keep = values == value
            summary = scores.summary(keep)
            metric_names = next(iter(summary.values())).keys()
            table[value] = {
                "num_tasks": int(keep.sum()),
                # tasks each metric is defined on (MAPE needs a truth without zeros, MASE
                # a history that is not constant); the same for every method
                "num_scored": {
                    k: min(int(s[k]["num_tasks"]) for s in summary.values()) for k in metric_names
                },
                "scores": {m: {k: v["value"] for k, v in s.items()} for m, s in summary.items()},
                "diverged": {
                    m: next(iter(s.values()))["num_diverged"]
                    for m, s in summary.items()
                    if next(iter(s.values()))["num_diverged"]
                },
            }
        out[name] = table
    return out


def _result(scores: TaskScores, classification, with_store, options, learner) -> dict[str, Any]:
    named = CLASSIFICATION_METHODS if classification else FORECAST_METHODS
    labels = {
        m: named[m] if m in named else combination_label(m.split("+")) for m in scores.methods
    }
    if classification:
        primary = "accuracy"
    elif with_store:
        primary = options.primary_metric
    else:
        primary = options.primary_metric if options.primary_metric in REGRESSION_METRICS else "mse"
    result: dict[str, Any] = {
        "title": "Meta-test evaluation",
        "kind": "classification"
        if classification
        else ("forecast" if with_store else "regression"),
        "num_tasks": scores.num_tasks,
        "methods": labels,
        "metrics": list(scores.metric_names) + (list(DERIVED_METRICS) if scores.has_owa else []),
        "primary_metric": primary,
        "primary_metric_label": {
            "smape": "sMAPE",
            "mape": "MAPE",
            "mase": "MASE",
            "mae": "MAE",
            "mse": "MSE",
            "accuracy": "accuracy",
        }[primary],
        "overall": overall_summary(scores, classification),
        "groups": {},
        "references": {
            name: {options.group_names.get(k, k): v for k, v in reference.items()}
            for name, reference in options.references.items()
        },
        "settings": {
            "split": options.split,
            "inner_steps": options.inner_steps
            if options.inner_steps is not None
            else getattr(learner, "eval_inner_steps", None),
            "scratch_steps": options.scratch_steps,
            "scratch_lr": options.scratch_lr,
            "seasonal_period": options.seasonal_period,
            "units": "original (store scaling inverted)" if with_store else "as sampled",
            "aggregation": "mean over all forecast points; ± 95% CI of the per-task mean"
            if not classification
            else "mean over tasks ± 95% CI",
        },
    }
    groupings = {g: options.group_names.get(g, g) for g in options.group_by}
    result["groups"] = group_summaries(scores, groupings)
    result["per_task"] = scores.table({**groupings, "entity": "entity"})
    if scores.points:
        result["forecasts"] = {
            (groupings.get(k, k) if k in ("stratum", "label") else k): v
            for k, v in scores.points.items()
        }
    return result
