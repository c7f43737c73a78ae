"""The scoring engine: adapt on each task's support set, score its query next to baselines.

`evaluate_tasks` scores, on the same tasks, the meta-trained model after adaptation and
without it, the same network trained from scratch on the support set, and (for
forecasting on a store) the naive, seasonal-naive and Theta forecasts, all in the store's
original units, plus any forecast combinations asked for (`eval.combinations`). A
prediction that diverges is counted as such, never averaged in (`TaskScores`).

Here is the episode loop and the result it returns. Each kind of task is scored in its
own module: forecasts on a store (`forecast_scoring`), N-way classification episodes
(`classification_scoring`) and regression tasks as sampled (`regression_scoring`); the
methods' predictions are made in `predictions`, and kept per task in `task_scores`.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from torch import nn

from metadist.batch import MetaBatch
from metadist.eval.cache import EvalCache
from metadist.eval.classification_scoring import classification_baselines, score_classification
from metadist.eval.cost import adaptation_steps, adaptation_steps_by_shots
from metadist.eval.forecast_only import check_forecast_only
from metadist.eval.forecast_scoring import ForecastScorer
from metadist.eval.learned_scoring import learned_methods
from metadist.eval.predictions import Predictor, ScratchBaseline
from metadist.eval.predictions import rolled_forecast as _forecast  # noqa: F401 (metadist.api)
from metadist.eval.regression_scoring import score_regression
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
from metadist.eval.shard import EvalShard, predict_share
from metadist.eval.statistical import StatisticalForecasts
from metadist.eval.task_scores import (
    DIVERGENCE_FACTOR,
    TaskScores,
    diverged,
    group_summaries,
    overall_summary,
)
from metadist.progress import Progress

__all__ = [
    "DIVERGENCE_FACTOR",
    "TaskScores",
    "diverged",
    "evaluate_tasks",
    "group_summaries",
    "overall_summary",
]

# The metrics summed per task, by the kind of task (`result["kind"]`).
_METRICS = {
    "forecast": FORECAST_METRICS,
    "classification": CLASSIFICATION_METRICS,
    "regression": REGRESSION_METRICS,
}
_METRIC_LABELS = {
    "smape": "sMAPE",
    "mape": "MAPE",
    "mase": "MASE",
    "mae": "MAE",
    "mse": "MSE",
    "accuracy": "accuracy",
}
# A function that adds one batch's tasks to the scores: (scores, batch, {method: array}).
Scorer = Callable[[TaskScores, MetaBatch, dict[str, np.ndarray]], None]
# The scorers of the tasks scored as sampled (forecasts on a store: `ForecastScorer`).
_SCORERS: dict[str, Scorer] = {
    "classification": score_classification,
    "regression": score_regression,
}


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
    cache: EvalCache | None = None,
    windows: Any = None,
    shard: EvalShard | None = None,
    examples_normalised: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Scores every method on every task of `batches`.

    Args:
        learner: a trained learner (`adapt`, `predict(params, x)`, `.model`, `.loss`).
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
        progress: show tasks done (`metadist.progress`: `None` too, a bar on a terminal,
            else a line every 15 s; `False`: nothing).
        num_tasks: tasks expected, for the progress display.
        pretrained: classification only: a backbone pretrained as an ordinary classifier
            of the meta-train classes (`baselines.pretrain_embedding`), scored as the
            "pretrained" baseline; `None` leaves it out. Classification always scores the
            nearest-centroid and 1-NN baselines on the raw examples.
        cache: an earlier evaluation's from-scratch predictions and statistical forecasts,
            reused where keys match and kept (`metadist.eval.cache`); `None`: all computed.
        windows: the run's `ForecastWindows`, for `eval.learned_combination`'s model forecasts.
        shard: this process's share of a sharded evaluation (`metadist.eval.shard`);
            `batches` must then be re-iterable (rank 0 draws them twice).
        examples_normalised: `EvaluationTasks.examples_normalised` (raw baselines).

    Returns:
        (result, examples): the result dict that `report.write_report` writes, and up to
        `options.num_examples` forecasts for the figure (`({}, [])` on other ranks).

    Raises:
        ValueError: a batch that does not fit the protocol (several query windows with a
            store, missing target columns), or bad options.
    """
    options.validate()
    kind = task_kind(learner, store, target_columns)
    if options.scratch_steps == 0:
        fresh_model = None  # with no steps, that row would be an untrained network
    methods = _methods(learner, options, kind, fresh_model is not None, pretrained)
    scores = TaskScores(methods, _METRICS[kind])
    score, forecasts = _scorer(kind, methods, store, target_columns, options, cache, learner, windows)  # fmt: skip
    scratch = _scratch(learner, fresh_model, options, cache)
    predict, local = _predictors(learner, options, methods, kind, pretrained, shard, examples_normalised, cache)  # fmt: skip
    started = time.perf_counter()
    try:
        _score_batches(
            learner, batches, scores, predict, scratch, score, options, progress, num_tasks,
            shard, local,
        )  # fmt: skip
    finally:
        if forecasts is not None:
            forecasts.close()
    if shard is not None and not shard.is_main:
        return {}, []
    if scores.num_tasks == 0:
        raise ValueError("evaluate_tasks: no task to evaluate (the held-out split is empty)")
    result = dict(_result(scores, kind, options, learner), diverged=scores.num_diverged())
    _warn_diverged(result, scores.num_tasks)
    result["settings"]["seconds"] = round(time.perf_counter() - started, 2)
    result["settings"].update({} if forecasts is None else forecasts.settings())
    return result, ([] if forecasts is None else forecasts.examples())


def _scorer(
    kind: str,
    methods: list[str],
    store: Any,
    target_columns: list[int] | None,
    options: EvalOptions,
    cache: EvalCache | None,
    learner: nn.Module,
    windows: Any,
) -> tuple[Scorer, ForecastScorer | None]:
    """`(score, forecasts)`: the scorer of tasks of `kind`, and for forecasts on a store
    the `ForecastScorer` it is (with the statistical baselines, on every core)."""
    if kind != "forecast":
        return _SCORERS[kind], None
    assert target_columns is not None  # `task_kind` checks it
    statistical = StatisticalForecasts(methods, cache=cache)
    forecasts = ForecastScorer(
        store, target_columns, options, methods, statistical, learner, windows
    )
    return forecasts, forecasts


def _predictors(
    learner: nn.Module,
    options: EvalOptions,
    methods: list[str],
    kind: str,
    pretrained: nn.Module | None,
    shard: EvalShard | None,
    examples_normalised: bool,
    cache: EvalCache | None,
) -> tuple[Predictor, Callable[[MetaBatch], dict[str, Any]] | None]:
    """`(predict, local)`: what every rank predicts of its batches and what rank 0 adds
    (sharded, the ranks make the model's predictions, rank 0 the non-meta-learned
    classifiers'; `examples_normalised`, `cache`: see `classification_baselines`)."""
    sharded = shard is not None and shard.is_sharded
    unadapted = "unadapted" in methods
    predict = Predictor(
        learner, options, unadapted, "" if sharded else kind, pretrained, examples_normalised,
        cache,
    )  # fmt: skip
    local = None
    if sharded and kind == "classification":
        local = functools.partial(
            classification_baselines,
            pretrained=pretrained,
            examples_normalised=examples_normalised,
            cache=cache,
        )
    return predict, local


def _scratch(
    learner: nn.Module,
    fresh_model: Callable[[], nn.Module] | None,
    options: EvalOptions,
    cache: EvalCache | None,
) -> ScratchBaseline | None:
    """The from-scratch baseline, trained with the learner's loss on the learner's
    device; `None` without a `fresh_model`."""
    if fresh_model is None:
        return None
    parameter = next(learner.parameters(), None)
    device = None if parameter is None else parameter.device
    loss = getattr(learner, "loss", "mse")
    return ScratchBaseline(fresh_model, options, loss, device, cache)


def task_kind(learner: nn.Module, store: Any, target_columns: list[int] | None) -> str:
    """`classification` (a cross-entropy learner), `forecast` (other tasks on a store) or
    `regression` (scored as sampled).

    Raises:
        ValueError: forecasts on a store without their `target_columns`.
    """
    if getattr(learner, "loss", "mse") == "cross_entropy":
        return "classification"
    if store is None:
        return "regression"
    if target_columns is None:
        raise ValueError("evaluate_tasks: a store needs target_columns (the store columns of T)")
    return "forecast"


def _methods(
    learner: nn.Module, options: EvalOptions, kind: str, scratch: bool, pretrained: Any
) -> list[str]:
    """The methods scored on tasks of `kind`, in the report's order.

    Raises:
        ValueError: forecasting's methods for other tasks (`check_forecast_only`, whose
            notes `evaluate_run` printed), or a combination of a method that is not scored.
    """
    check_forecast_only(options, kind)
    methods = [m for m in MODEL_METHODS if m != "scratch" or scratch]
    if not getattr(learner, "has_inner_loop", True):
        methods.remove("unadapted")  # nothing to compare adaptation with
    if kind == "classification":
        methods += ["nearest_centroid", "one_nn"] + (
            ["pretrained", "baseline_pp"] if pretrained else []
        )
    combinations = [list(c) for c in options.combinations or []]
    if kind == "forecast":
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
    return methods + learned_methods(options, methods, kind)


def _score_batches(
    learner: nn.Module,
    batches: Iterable[MetaBatch],
    scores: TaskScores,
    predict: Predictor,
    scratch: ScratchBaseline | None,
    score: Scorer,
    options: EvalOptions,
    progress: bool | None,
    num_tasks: int | None,
    shard: EvalShard | None = None,
    local: Callable[[MetaBatch], dict[str, Any]] | None = None,
) -> None:
    """The episode loop: predicts and scores each batch (up to `options.max_tasks` tasks),
    with the learner in eval mode, showing each phase's progress: the tasks scored, the
    from-scratch network's task-steps and the statistical forecasts' series. Sharded,
    each rank predicts its batches and rank 0 scores every batch, adding `local(batch)`'s
    predictions (`_score_sharded`)."""
    was_training = learner.training
    learner.eval()
    if options.max_tasks is not None:
        num_tasks = min(num_tasks or options.max_tasks, options.max_tasks)
    display = Progress(progress, transient=True).__enter__()
    shown = display.counter("evaluating", num_tasks, "tasks")
    world = 1 if shard is None else shard.world_size
    if scratch is not None:
        # sharded, the ranks claim batches as they go: this rank's share is not known
        total = None if num_tasks is None or world > 1 else num_tasks * options.scratch_steps
        label = "from scratch" if world == 1 else "from scratch (on rank 0)"
        scratch.counter = display.counter(label, total, "task-steps")
    if isinstance(score, ForecastScorer):
        # with a learned combination, each series' validation window is forecast too
        per_series = 1 if score.learned is None else 2
        jobs = None if num_tasks is None else num_tasks * per_series
        label = "statistical forecasts" + (
            "" if per_series == 1 else " (holdout and validation window of each series)"
        )
        score.statistical.counter = display.counter(label, jobs, "forecasts")

    def arrays(batch: MetaBatch) -> dict[str, np.ndarray]:
        predictions = predict(batch)
        if scratch is not None:
            predictions["scratch"] = scratch(batch)
        return {k: v.detach().cpu().numpy() for k, v in predictions.items()}

    try:
        if shard is not None and shard.is_sharded:
            _score_sharded(shard, batches, arrays, local, scores, score, options, shown)
        else:
            done = 0  # tasks predicted: a learned combination scores them only at `finish`
            for batch in _started_ahead(_limited(batches, options.max_tasks), score):
                score(scores, batch, arrays(batch))
                done += batch.num_tasks
                shown.update(done)
        if isinstance(score, ForecastScorer) and (shard is None or shard.is_main):
            # the tasks held back for the learned combination, once its weights are fitted
            learned = score.learned
            fits = None if learned is None else learned.num_fits()
            score.finish(
                None if fits is None else display.counter("learned combination", fits, "fits")
            )
    finally:
        display.close()
        learner.train(was_training)


def _score_sharded(
    shard: EvalShard,
    batches: Iterable[MetaBatch],
    arrays: Callable[[MetaBatch], dict[str, np.ndarray]],
    local: Callable[[MetaBatch], dict[str, Any]] | None,
    scores: TaskScores,
    score: Scorer,
    options: EvalOptions,
    shown: Any,
) -> None:
    """Each rank predicts its share of the batches (`predict_share`); rank 0 then draws
    the batches again and scores each, in order, with the predictions gathered and those
    of `local` (the classification baselines, cheap, made here)."""
    if iter(batches) is batches:
        raise ValueError(
            "a sharded evaluation draws the batches twice: pass a re-iterable "
            "(metadist.eval.shard.Reiterable), not an iterator"
        )
    start = score.start if isinstance(score, ForecastScorer) else None
    every = predict_share(shard, _limited(batches, options.max_tasks), arrays, start)
    if every is None:  # another rank's predictions are scored on rank 0
        return
    done = 0  # as in `_score_batches`
    for index, batch in enumerate(_limited(batches, options.max_tasks)):
        predictions = every.pop(index)
        if local is not None:
            predictions.update({k: v.cpu().numpy() for k, v in local(batch).items()})
        score(scores, batch, predictions)
        done += batch.num_tasks
        shown.update(done)


def _limited(batches: Iterable[MetaBatch], max_tasks: int | None) -> Iterator[MetaBatch]:
    """The batches, cut at `max_tasks` tasks in all."""
    done = 0
    for batch in batches:
        if max_tasks is not None and done >= max_tasks:
            return
        if max_tasks is not None:
            batch = batch.select(slice(0, max_tasks - done))
        done += batch.num_tasks
        yield batch


def _started_ahead(batches: Iterable[MetaBatch], score: Scorer) -> Iterator[MetaBatch]:
    """The batches, each started by a scorer that has a `start` (forecasts: the
    statistical baselines, in worker processes) one batch ahead of the one yielded, so
    the workers have work while this process predicts."""
    if not isinstance(score, ForecastScorer):
        yield from batches
        return
    waiting: deque[MetaBatch] = deque()
    for batch in batches:
        score.start(batch)
        waiting.append(batch)
        if len(waiting) > 1:
            yield waiting.popleft()
    while waiting:
        yield waiting.popleft()


def _warn_diverged(result: dict[str, Any], num_tasks: int) -> None:
    for method, count in result["diverged"].items():
        print(
            f"warning: {result['methods'][method]} diverged on {count} of {num_tasks} "
            "tasks (non-finite or exploding predictions); reported as diverged, not averaged",
            file=sys.stderr,
        )


def _result(
    scores: TaskScores, kind: str, options: EvalOptions, learner: nn.Module
) -> dict[str, Any]:
    """The result dict `report.write_report` writes (without `diverged` and `seconds`)."""
    named = CLASSIFICATION_METHODS if kind == "classification" else FORECAST_METHODS
    labels = {
        m: named[m] if m in named else combination_label(m.split("+")) for m in scores.methods
    }
    primary = _primary_metric(kind, options)
    groupings = {g: options.group_names.get(g, g) for g in options.group_by}
    result: dict[str, Any] = {
        "title": "Meta-test evaluation",
        "kind": kind,
        "num_tasks": scores.num_tasks,
        "methods": labels,
        "metrics": list(scores.metric_names) + (list(DERIVED_METRICS) if scores.has_owa else []),
        "primary_metric": primary,
        "primary_metric_label": _METRIC_LABELS[primary],
        "overall": overall_summary(scores, kind == "classification"),
        "groups": group_summaries(scores, groupings),
        "references": {
            name: {options.group_names.get(k, k): v for k, v in reference.items()}
            for name, reference in options.references.items()
        },
        "settings": _settings(kind, options, learner),
        "per_task": scores.table({**groupings, "entity": "entity"}),
    }
    if scores.points:
        result["forecasts"] = {
            (groupings.get(k, k) if k in ("stratum", "label") else k): v
            for k, v in scores.points.items()
        }
    return result


def _primary_metric(kind: str, options: EvalOptions) -> str:
    if kind == "classification":
        return "accuracy"
    if kind == "forecast":
        return options.primary_metric
    return options.primary_metric if options.primary_metric in REGRESSION_METRICS else "mse"


def _settings(kind: str, options: EvalOptions, learner: nn.Module) -> dict[str, Any]:
    """The evaluation's settings, as the report's settings line shows them: only those
    that apply (no `inner_steps` for a learner without an inner loop, no seasonal period
    outside forecasting, no from-scratch learning rate without its steps)."""
    settings = {
        "split": options.split,
        "inner_steps": adaptation_steps(learner, options),
        "inner_steps_by_shots": adaptation_steps_by_shots(learner, options),
        "scratch_steps": options.scratch_steps,
        "scratch_lr": options.scratch_lr if options.scratch_steps > 0 else None,
        "seasonal_period": options.seasonal_period if kind == "forecast" else None,
        "units": "original (store scaling inverted)" if kind == "forecast" else "as sampled",
        "aggregation": "mean over all forecast points; ± 95% CI of the per-task mean"
        if kind != "classification"
        else "mean over tasks ± 95% CI",
    }
    return {key: value for key, value in settings.items() if value is not None}
