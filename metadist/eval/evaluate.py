"""Meta-test evaluation: adapt on each held-out task's support set, score its query.

`evaluate_tasks` is the engine: given a learner and batches of tasks it scores, on the
same tasks, the meta-trained model after adaptation and without it, the same network
trained from scratch on the support set, and (for forecasting on a store) the naive,
seasonal-naive and Theta-method forecasts, all in the store's original units, and any
forecast combinations asked for (`eval.combinations`, e.g. the adapted model averaged with
Theta). `evaluate_run` wires it to a training run directory (config, latest checkpoint,
meta-test entities) and writes the report; `python -m metadist.eval run_dir=...` is its
command line.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from metadist.batch import MetaBatch
from metadist.eval import baselines, metrics
from metadist.eval.progress import TaskProgress, eval_threads

FORECAST_METHODS = {
    "adapted": "meta-trained + adapted",
    "unadapted": "meta-trained, no adaptation",
    "scratch": "same network from scratch on support",
    "naive": "naive (last value)",
    "seasonal_naive": "seasonal naive",
    "theta": "Theta method",
}
CLASSIFICATION_METHODS = {
    "adapted": "meta-trained + adapted",
    "unadapted": "meta-trained, no adaptation",
    "scratch": "same backbone from scratch on support",
    "nearest_centroid": "nearest centroid (z-normalised raw)",
    "one_nn": "1-NN, Euclidean (z-normalised raw)",
    "pretrained": "pretrained embedding + nearest centroid",
}
FORECAST_METRICS = ("smape", "mase", "mae", "mse")
REGRESSION_METRICS = ("mse", "mae")
CLASSIFICATION_METRICS = ("accuracy",)
MODEL_METHODS = ("adapted", "unadapted", "scratch")
# What a method is called inside a combination's label ("mean of adapted model and Theta").
_SHORT_NAMES = {
    "adapted": "adapted model",
    "unadapted": "unadapted model",
    "scratch": "from-scratch network",
    "naive": "naive",
    "seasonal_naive": "seasonal naive",
    "theta": "Theta",
}


@dataclass
class EvalOptions:
    """How a run is evaluated (the `eval` section of an experiment config).

    Attributes:
        inner_steps: adaptation steps on each support set; `None` uses the learner's
            `eval_inner_steps`.
        scratch_steps: Adam steps of the from-scratch baseline on each support set.
        scratch_lr: its learning rate.
        pretrain_steps: Adam steps of the pretrained-embedding classification baseline
            (the backbone trained as an ordinary classifier of the meta-train classes);
            0 leaves that baseline out.
        pretrain_lr: its learning rate.
        pretrain_batch_size: labelled meta-train examples per step.
        seasonal_period: m for MASE and the seasonal-naive forecast: one integer, or a
            mapping from stratum name to m (every evaluated stratum must be present).
        batch_size: tasks adapted at once.
        max_tasks: evaluate a seeded random subset (`seed`) of this many held-out tasks
            (`None`: all of them).
        tasks_per_unit: episodes drawn from each evaluated unit, for samplers whose
            episodes are random (N-way K-shot: each unit anchors this many episodes of
            its split's classes); the forecast protocol takes 1.
        num_examples: query forecasts drawn in the figure.
        split: the units evaluated: `test` (meta-test, default), `val`, or `all` (every
            unit; for a `holdout`, whose truth no training task can reach).
        seasonal_period_from: what a `seasonal_period` mapping is keyed by: `stratum`
            or `label`.
        sampler_options: sampler options replaced for evaluation; the `forecast`
            sampler always gets `split: end, num_query: 1` (adapt on the history,
            forecast the last H steps).
        holdout: score forecasts of a separate holdout file instead of the store's last
            H steps (competition protocol): `{path, entity_col, time_col, value_col}`;
            see `metadist.eval.holdout`.
        primary_metric: the metric of the per-group tables (and of the demo's verdict):
            `smape` (default), `mase`, `mae` or `mse`; classification always uses accuracy.
        group_by: per-group tables of the primary metric: `stratum` and/or `label`.
        group_names: what strata and labels are called in the tables, e.g.
            `{stratum: category, label: frequency}`.
        references: published figures shown next to the primary metric, e.g.
            `{"Theta": {"all": 13.01, "stratum": {"yearly": 16.90}}}`.
        seed: seed of the from-scratch initialisation.
        ensemble: other run directories of the same data and sampler; their latest
            checkpoints join the run's own as an ensemble (`LearnerEnsemble`): each
            adapts on its own, and the adapted and unadapted forecasts are the
            `ensemble_reduce` of the members' forecasts.
        ensemble_reduce: "mean" or "median".
        labels: evaluate only the entities with one of these store labels (e.g. the
            frequencies a model of one horizon serves, when it was trained on every
            series); `None`: every entity the sampler draws from.
        combinations: forecast combinations scored as methods of their own, each a list
            of two or more forecast methods (`adapted`, `unadapted`, `scratch`, `naive`,
            `seasonal_naive`, `theta`) whose forecasts are averaged point by point in
            original units, e.g. `[[adapted, theta]]`, named `adapted+theta`. Forecasting
            on a store only; `None`: none.
    """

    inner_steps: int | None = None
    scratch_steps: int = 100
    scratch_lr: float = 1e-2
    pretrain_steps: int = 500
    pretrain_lr: float = 1e-3
    pretrain_batch_size: int = 64
    seasonal_period: int | dict[str, int] = 1
    batch_size: int = 128
    max_tasks: int | None = None
    tasks_per_unit: int = 1
    num_examples: int = 6
    split: str = "test"
    seasonal_period_from: str = "stratum"
    sampler_options: dict[str, Any] = field(default_factory=dict)
    holdout: dict[str, Any] | None = None
    primary_metric: str = "smape"
    group_by: list[str] = field(default_factory=lambda: ["stratum"])
    group_names: dict[str, str] = field(default_factory=dict)
    references: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    labels: list[str] | None = None
    ensemble: list[str] | None = None
    ensemble_reduce: str = "mean"
    combinations: list[list[str]] | None = None

    def validate(self) -> None:
        """Raises `ValueError` naming the first bad field."""
        if self.inner_steps is not None and self.inner_steps < 0:
            raise ValueError(f"eval.inner_steps must be >= 0 or null, got {self.inner_steps}")
        if self.scratch_steps < 0:
            raise ValueError(f"eval.scratch_steps must be >= 0, got {self.scratch_steps}")
        if not self.scratch_lr > 0:
            raise ValueError(f"eval.scratch_lr must be > 0, got {self.scratch_lr}")
        if self.pretrain_steps < 0:
            raise ValueError(f"eval.pretrain_steps must be >= 0, got {self.pretrain_steps}")
        if not self.pretrain_lr > 0:
            raise ValueError(f"eval.pretrain_lr must be > 0, got {self.pretrain_lr}")
        if self.pretrain_batch_size < 1:
            raise ValueError(
                f"eval.pretrain_batch_size must be >= 1, got {self.pretrain_batch_size}"
            )
        periods = (
            self.seasonal_period.values()
            if isinstance(self.seasonal_period, dict)
            else [self.seasonal_period]
        )
        for m in periods:
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise ValueError(f"eval.seasonal_period values must be integers >= 1, got {m!r}")
        if self.batch_size < 1:
            raise ValueError(f"eval.batch_size must be >= 1, got {self.batch_size}")
        if self.max_tasks is not None and self.max_tasks < 1:
            raise ValueError(f"eval.max_tasks must be >= 1 or null, got {self.max_tasks}")
        if (
            isinstance(self.tasks_per_unit, bool)
            or not isinstance(self.tasks_per_unit, int)
            or (self.tasks_per_unit < 1)
        ):
            raise ValueError(
                f"eval.tasks_per_unit must be an integer >= 1, got {self.tasks_per_unit!r}"
            )
        if self.num_examples < 0:
            raise ValueError(f"eval.num_examples must be >= 0, got {self.num_examples}")
        if self.split not in ("test", "val", "all"):
            raise ValueError(f"eval.split must be 'test', 'val' or 'all', got {self.split!r}")
        if self.primary_metric not in FORECAST_METRICS:
            raise ValueError(
                f"eval.primary_metric must be one of {', '.join(FORECAST_METRICS)}, got "
                f"{self.primary_metric!r}"
            )
        for grouping in self.group_by:
            if grouping not in ("stratum", "label"):
                raise ValueError(
                    f"eval.group_by entries must be stratum or label, got {grouping!r}"
                )
        if self.labels is not None and (
            isinstance(self.labels, str) or not self.labels or not all(self.labels)
        ):
            raise ValueError(
                f"eval.labels must be a non-empty list of labels or null, got {self.labels!r}"
            )
        if self.ensemble is not None and (
            isinstance(self.ensemble, str) or not all(isinstance(p, str) for p in self.ensemble)
        ):
            raise ValueError(
                f"eval.ensemble must be a list of run directories or null, got {self.ensemble!r}"
            )
        if self.ensemble_reduce not in ("mean", "median"):
            raise ValueError(
                f"eval.ensemble_reduce must be 'mean' or 'median', got {self.ensemble_reduce!r}"
            )
        if self.combinations is not None and not isinstance(self.combinations, (list, tuple)):
            raise ValueError(
                "eval.combinations must be a list of method lists or null, e.g. "
                f"[[adapted, theta]], got {self.combinations!r}"
            )
        for combination in self.combinations or []:
            _check_combination(combination)
        if self.combinations and len({frozenset(c) for c in self.combinations}) < len(
            self.combinations
        ):
            raise ValueError(
                "eval.combinations lists the same methods twice (in any order), got "
                f"{self.combinations!r}"
            )
        if self.seasonal_period_from not in ("stratum", "label"):
            raise ValueError(
                "eval.seasonal_period_from must be 'stratum' or 'label', got "
                f"{self.seasonal_period_from!r}"
            )

    def period_of(self, stratum: str, label: str = "") -> int:
        """m for a task of `stratum` / `label`; `ValueError` if a mapping does not name it."""
        if not isinstance(self.seasonal_period, dict):
            return int(self.seasonal_period)
        key = stratum if self.seasonal_period_from == "stratum" else label
        try:
            return int(self.seasonal_period[key])
        except KeyError:
            known = ", ".join(sorted(self.seasonal_period))
            raise ValueError(
                f"eval.seasonal_period has no entry for {self.seasonal_period_from} {key!r} "
                f"(has: {known})"
            ) from None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EvalOptions:
        """Options from a plain mapping; `ValueError` naming an unknown or bad field."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"eval.{unknown[0]}: unknown field; eval has: {', '.join(names)}")
        from metadist.train.config import check_finite_numbers

        values = dict(values)
        for f in fields(cls):
            kind = type(f.default)
            value = values.get(f.name)
            if kind in (int, float) and isinstance(value, str):
                # an override such as eval.scratch_lr=nan or eval.batch_size=abc
                try:
                    values[f.name] = kind(value)
                except ValueError:
                    what = "an integer" if kind is int else "a number"
                    raise ValueError(f"eval.{f.name} must be {what}, got {value!r}") from None
        check_finite_numbers({"eval": values})
        options = cls(**values)
        options.validate()
        return options


def combination_key(methods: Iterable[str]) -> str:
    """The method name of a forecast combination: its members joined by `+`."""
    return "+".join(methods)


def combination_label(methods: Iterable[str]) -> str:
    """A combination's row label, e.g. "mean of adapted model and Theta"."""
    names = [_SHORT_NAMES[m] for m in methods]
    return "mean of " + ", ".join(names[:-1]) + " and " + names[-1]


def _check_combination(combination: Any) -> None:
    if not isinstance(combination, (list, tuple)):
        raise ValueError(
            f"eval.combinations entries must be lists of methods, got {combination!r} "
            "(write [[adapted, theta]], not [adapted, theta])"
        )
    unknown = [m for m in combination if m not in FORECAST_METHODS]
    if unknown:
        raise ValueError(
            f"eval.combinations: unknown method {unknown[0]!r} in {list(combination)}; "
            f"methods: {', '.join(FORECAST_METHODS)}"
        )
    if len(set(combination)) < 2 or len(set(combination)) < len(combination):
        raise ValueError(
            "eval.combinations: a combination needs two or more different methods, got "
            f"{list(combination)}"
        )


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
        self.sums = {m: {k: [] for k in self.metric_names} for m in self.methods}
        self.diverged: dict[str, list[bool]] = {m: [] for m in self.methods}
        self.counts: list[int] = []
        self.groups: dict[str, list[str]] = {}

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
        return out

    def num_diverged(self) -> dict[str, int]:
        """`{method: tasks on which it diverged}`, for the methods that did."""
        counts = {m: int(sum(flags)) for m, flags in self.diverged.items()}
        return {m: n for m, n in counts.items() if n}


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
            from-scratch baseline; `None` leaves that baseline out.
        progress: show tasks done (`TaskProgress`: `None` also shows it, as a bar on a
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
    if with_store:
        methods += ["naive", "seasonal_naive", "theta"]
        for combination in combinations:
            missing = [m for m in combination if m not in methods]
            if missing:
                raise ValueError(
                    f"eval.combinations: {combination} needs {missing[0]!r}, which this "
                    "evaluation does not score (an embedding model has no from-scratch "
                    "baseline)"
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
    shown = TaskProgress(num_tasks, progress)
    shown.start()
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
                    lambda x, m=scratch_template, p=params: baselines.predict_stacked(m, p, x),
                    batch,
                )
            predictions = {k: v.detach().cpu().numpy() for k, v in predictions.items()}
            if classification:
                _score_classification(scores, batch, predictions, store)
            elif with_store:
                _score_forecasts(
                    scores,
                    batch,
                    predictions,
                    store,
                    target_columns,
                    options,
                    examples,
                    spare,
                    example_groups,
                )
            else:
                _score_regression(scores, batch, predictions)
            shown.update(scores.num_tasks)
    finally:
        shown.close()
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
        forecasts["theta"] = baselines.theta_forecast(history, horizon, period)
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
                "mase": float(scaled.sum()),
                "mae": float(abs_err.sum()),
                "mse": float(metrics.squared_errors(truth[b], forecast).sum()),
            }
        groups = {"stratum": stratum, "label": label, "entity": str(store.entity_ids[entity])}
        scores.add(sums, truth[b].size, groups, failed)
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
    """`{name: {group value: {num_tasks, scores: {method: {metric: value}}}}}` for each
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
            table[value] = {
                "num_tasks": int(keep.sum()),
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
        "metrics": list(scores.metric_names),
        "primary_metric": primary,
        "primary_metric_label": {
            "smape": "sMAPE",
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
    return result


def split_eval_overrides(overrides: Iterable[str]) -> tuple[list[str], list[str]]:
    """(training overrides, `eval.KEY=VALUE` overrides) of a command line."""
    overrides = list(overrides)
    return (
        [o for o in overrides if not o.startswith("eval.")],
        [o for o in overrides if o.startswith("eval.")],
    )


def load_eval_options(
    experiment: str, overrides: Iterable[str] = (), config_dir: str | None = None
) -> EvalOptions:
    """The evaluation settings of `experiment`, with `eval.KEY=VALUE` overrides applied.

    They are read from `experiments/eval/<experiment>.yaml` if it exists, else
    `experiments/eval/default.yaml`, else the `EvalOptions` defaults.

    Raises:
        ValueError: an override not of the form `eval.KEY=VALUE`, or a bad field.
    """
    from omegaconf import OmegaConf

    from metadist.train.compose import find_experiments_dir

    values: dict[str, Any] = {}
    try:
        eval_dir = find_experiments_dir(config_dir) / "eval"
    except FileNotFoundError:
        eval_dir = None
    if eval_dir is not None:
        for name in (experiment, "default"):
            path = eval_dir / f"{name}.yaml"
            if path.is_file():
                loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
                if not isinstance(loaded, dict):
                    raise ValueError(f"{path} must hold a mapping of eval settings")
                values = loaded
                break
    dotlist = []
    for override in overrides:
        key, sep, _ = override.partition("=")
        if not sep or not key.startswith("eval."):
            raise ValueError(f"evaluation override {override!r} must look like eval.KEY=VALUE")
        dotlist.append(override[len("eval.") :])
    if dotlist:
        merged = OmegaConf.merge(OmegaConf.create(values), OmegaConf.from_dotlist(dotlist))
        values = OmegaConf.to_container(merged, resolve=True)
    return EvalOptions.from_dict(values)


def evaluate_run(
    run_dir: str | os.PathLike,
    *,
    overrides: Iterable[str] = (),
    options: EvalOptions | None = None,
    config_dir: str | None = None,
    write: bool = True,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Evaluates a training run's latest checkpoint on its held-out tasks.

    Rebuilds the run's store, sampler (evaluation protocol), partition, model and learner
    from the config saved in the checkpoint, loads the meta-trained weights, scores every
    method (`evaluate_tasks`) and writes `metrics.json`, `metrics.md`, `tasks.parquet`
    and `forecasts.png` to `<run_dir>/eval/`. With `eval.ensemble`, the other runs'
    checkpoints join this one's (`LearnerEnsemble`).

    Args:
        run_dir: a run directory written by `python -m metadist.train`.
        overrides: `eval.KEY=VALUE` settings (see `EvalOptions`).
        options: the settings, instead of reading them from the experiment's eval file.
        config_dir: the experiments directory (default: as training looks it up).
        write: write the report files.
        progress: show tasks done as in `evaluate_tasks` (default: a bar on a terminal,
            else a line every 15 s). Evaluation runs on one intra-op thread unless
            `OMP_NUM_THREADS` is set (`progress.eval_threads`).

    Returns:
        The result dict, with `paths` (the files written) added.

    Raises:
        FileNotFoundError: no run directory or no checkpoint in it, or a missing store.
        ValueError: bad settings, or tasks the evaluation protocol cannot score.
    """
    from metadist.models import build_model

    run_dir = Path(run_dir)
    config, state, checkpoint_path, pointer = _load_run(run_dir, "run_dir")
    if options is None:
        options = load_eval_options(config.experiment, overrides, config_dir)
    options.validate()
    parts = _eval_parts(config, options, state.get("store_identity"), run_dir)
    learner = _trained_learner(config, state, parts)
    members = [f"{run_dir} ({checkpoint_path.name})"]
    if options.ensemble:
        from metadist.learners.ensemble import LearnerEnsemble

        learners, lookbacks = [learner], [None]
        for member_dir in options.ensemble:
            member, name, lookback = _ensemble_member(Path(member_dir), config, parts)
            learners.append(member)
            lookbacks.append(lookback)
            members.append(f"{member_dir} ({name})")
        learner = LearnerEnsemble(learners, reduce=options.ensemble_reduce, lookbacks=lookbacks)

    classification = getattr(learner, "loss", "mse") == "cross_entropy"

    def build_fresh(output_shape: tuple[int, ...] = parts["task_output_shape"]) -> nn.Module:
        return build_model(
            config.model.name, parts["input_shape"], output_shape, **config.model.options
        )

    # From scratch, a classifier gets one output per way (an embedding network, e.g. of
    # protonet, gets that head in place of its embedding); a forecasting embedding network
    # has no output to train on its own, so the baseline does not apply.
    fresh_model = build_fresh if classification or config.model.output_shape is None else None
    pretrained = None
    tasks = parts["tasks"]
    if classification and options.pretrain_steps > 0 and tasks.labelled_examples is not None:
        embedding_size = int(np.prod(config.model.output_shape or [64]))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(options.seed)
            backbone = build_fresh((embedding_size,))
        pretrained = baselines.pretrain_embedding(
            backbone,
            tasks.labelled_examples,
            num_classes=tasks.num_classes,
            embedding_size=embedding_size,
            steps=options.pretrain_steps,
            lr=options.pretrain_lr,
            batch_size=options.pretrain_batch_size,
            seed=options.seed,
        )

    with eval_threads():
        result, examples = evaluate_tasks(
            learner,
            parts["batches"],
            options=options,
            # forecasts are scored in original units when the sampler names their store
            # columns; other tasks are scored as sampled
            store=parts["store"] if parts["target_columns"] is not None else None,
            target_columns=parts["target_columns"],
            fresh_model=fresh_model,
            progress=progress,
            num_tasks=parts["num_tasks"],
            pretrained=pretrained,
        )
    step = int(state.get("step", pointer.get("step", 0)))
    result["title"] = f"{config.experiment}: evaluation on held-out tasks after {step} meta-steps"
    result["settings"] = {
        "experiment": config.experiment,
        "checkpoint": checkpoint_path.name,
        "learner": config.learner.name,
        "model": config.model.name,
        "tasks": parts["description"],
        **result["settings"],
    }
    if options.ensemble:
        result["settings"]["ensemble"] = f"{options.ensemble_reduce} of " + ", ".join(members)
    if write:
        from metadist.eval.report import write_report

        result["paths"] = {k: str(v) for k, v in write_report(result, run_dir, examples).items()}
    return result


def _load_run(run_dir: Path, field: str) -> tuple[Any, dict[str, Any], Path, dict[str, Any]]:
    """(config, checkpoint state, checkpoint path, pointer) of a run's latest checkpoint.

    Raises:
        FileNotFoundError: no directory at `run_dir` (named as `field`), or no checkpoint.
    """
    from metadist.train.checkpoint import latest_checkpoint, load_checkpoint
    from metadist.train.config import build_config

    if not run_dir.is_dir():
        raise FileNotFoundError(f"{field}: no run directory at {run_dir}")
    found = latest_checkpoint(run_dir)
    if found is None:
        raise _no_checkpoint_error(run_dir)
    checkpoint_path, pointer = found
    state = load_checkpoint(checkpoint_path, pointer)
    return build_config(state["config"], world_size=1), state, checkpoint_path, pointer


def _trained_learner(
    config, state: dict[str, Any], parts: dict[str, Any], input_shape: tuple | None = None
) -> nn.Module:
    """The run's learner with the checkpoint's weights (its model taking `input_shape`,
    default the evaluated tasks' input shape)."""
    from metadist.learners import build_learner
    from metadist.models import build_model

    torch.manual_seed(config.trainer.seed)
    model = build_model(
        config.model.name,
        input_shape or parts["input_shape"],
        parts["output_shape"],
        **config.model.options,
    )
    learner = build_learner(config.learner.name, model, **config.learner.options)
    learner.load_state_dict(state["learner"])
    from metadist.train.distributed import evaluation_device

    return learner.to(evaluation_device(config.trainer.device))


def _ensemble_member(
    run_dir: Path, config, parts: dict[str, Any]
) -> tuple[nn.Module, str, int | None]:
    """(learner, checkpoint name, lookback or None) of the ensemble member `run_dir`.

    It must have been trained on the evaluated run's store with the same sampler, up to
    a lookback no longer than the evaluated run's, so that it can forecast its tasks.
    """
    from metadist.train.config import without_nulls

    member, state, checkpoint_path, _ = _load_run(run_dir, "eval.ensemble")
    from metadist.tasks import get_task_sampler

    mine = without_nulls(dict(member.sampler.options))
    theirs = without_nulls(dict(config.sampler.options))
    sampler_class = get_task_sampler(config.sampler.name)
    for key in sampler_class.training_only_options:
        mine.pop(key, None)
        theirs.pop(key, None)
    lookback = None
    if sampler_class.ensemble_may_shorten_lookback and mine.get("lookback") != theirs.get(
        "lookback"
    ):
        lookback = int(mine.get("lookback") or 0)
        if not 0 < lookback < int(theirs.get("lookback") or 0):
            raise ValueError(
                f"eval.ensemble: {run_dir} looks back {mine.get('lookback')} rows, more than "
                f"the evaluated run's {theirs.get('lookback')}; evaluate the run with the "
                "longest lookback and list the others as members"
            )
        for key in ("lookback", "pad_inputs"):
            mine.pop(key, None)
            theirs.pop(key, None)
    for setting, a, b in (
        ("data.store", member.data.store, config.data.store),
        ("sampler.name", member.sampler.name, config.sampler.name),
        ("sampler.options", mine, theirs),
    ):
        if a != b:
            raise ValueError(
                f"eval.ensemble: {run_dir} was trained with {setting}={a!r}, the evaluated "
                f"run with {b!r}; members must see the same tasks"
            )
    if parts["store"] is not None:
        from metadist.store.identity import check_store_identity

        check_store_identity(
            state.get("store_identity"), parts["store"], f"eval.ensemble member {run_dir}"
        )
    input_shape = None if lookback is None else (lookback, *parts["input_shape"][1:])
    return _trained_learner(member, state, parts, input_shape), checkpoint_path.name, lookback


def _no_checkpoint_error(run_dir: Path) -> FileNotFoundError:
    """The error for a run_dir without a checkpoint, pointing at run directories inside it."""
    from metadist.train.checkpoint import LATEST, checkpoint_dir

    inside = sorted(
        sub
        for sub in run_dir.iterdir()
        if sub.is_dir() and (checkpoint_dir(sub) / LATEST).is_file()
    )
    if inside:
        runs = ", ".join(f"run_dir={sub}" for sub in inside)
        return FileNotFoundError(
            f"run_dir {run_dir} has no checkpoint, but it contains a run that has: "
            f"evaluate that instead ({runs})"
        )
    return FileNotFoundError(
        f"run_dir {run_dir} has no checkpoint yet; train first "
        f"(python -m metadist.train experiment=NAME run_dir={run_dir})"
    )


def _eval_parts(
    config, options: EvalOptions, recorded_identity: dict | None = None, run_dir: Any = ""
) -> dict[str, Any]:
    """Store, held-out task batches and model shapes of a run, for evaluation.

    The split is rebuilt exactly as training built it (`DataConfig.partitioner`), and the
    sampler's own evaluation protocol (`TaskSampler.for_evaluation`) says which episodes
    of the split are scored: every example of every episode comes from the split.
    """
    from metadist.store.identity import check_store_identity
    from metadist.tasks import build_task_sampler, derive_task_seeds
    from metadist.train.build import example_shapes, open_store

    store, _ = open_store(config)
    if store is not None:
        check_store_identity(recorded_identity, store, f"run_dir {run_dir}")
    train_sampler = build_task_sampler(config.sampler.name, store, **config.sampler.options)
    seed = config.trainer.seed
    example = train_sampler.sample(
        np.zeros(1, dtype=np.int64), derive_task_seeds(seed, 0, np.zeros(1))
    )
    input_shape, task_output_shape = example_shapes(example, train_sampler)
    output_shape = task_output_shape
    if config.model.output_shape is not None:  # e.g. the embedding of a prototypical network
        output_shape = tuple(config.model.output_shape)
    partitioner = config.data.partitioner(train_sampler, store, seed)
    if options.split == "all":
        units = np.arange(train_sampler.num_units, dtype=np.int64)
    else:
        units = np.asarray(partitioner.units(options.split), dtype=np.int64)
    if len(units) == 0:
        raise ValueError(
            f"eval.split={options.split!r}: the run's partition has no {options.split} units "
            f"(data.fractions={list(config.data.fractions)})"
        )
    entity_mask = None if options.labels is None else _has_labels(store, options.labels)
    holdout = None if options.holdout is None else _holdout_reader(store, options)
    tasks = train_sampler.for_evaluation(
        units,
        split=options.split,
        tasks_per_unit=options.tasks_per_unit,
        max_tasks=options.max_tasks,
        seed=options.seed,
        entity_mask=entity_mask,
        train_units=partitioner.units("train"),
        holdout=holdout,
        **options.sampler_options,
    )
    if tasks.num_tasks == 0 and options.labels is not None and holdout is None:
        raise ValueError(
            f"eval.labels={options.labels}: none of the {options.split} units has them"
        )
    description = tasks.description
    if options.holdout is not None:
        description += f" from {options.holdout['path']}"
    return {
        "store": store,
        "tasks": tasks,
        "batches": tasks.batches(options.batch_size, options.seed),
        "input_shape": input_shape,
        "output_shape": output_shape,
        "task_output_shape": task_output_shape,
        "target_columns": tasks.target_columns,
        "description": description,
        "num_tasks": tasks.num_tasks,
    }


def _has_labels(store, labels: list[str]) -> np.ndarray:
    """`[E]` bool: the store's entities with one of `labels` (`ValueError` for unknown ones)."""
    if store is None:
        raise ValueError("eval.labels needs a series store (entities with labels)")
    try:
        return store.has_label(labels)
    except ValueError as error:
        raise ValueError(f"eval.labels: {error}") from None


def _holdout_reader(store, options: EvalOptions):
    """The `HoldoutReader` of `eval.holdout`: the sampler reads the columns it forecasts
    (or the spec's `value_cols`) and checks which of its entities the file covers."""
    from metadist.eval.holdout import HoldoutReader

    if store is None:
        raise ValueError("eval.holdout needs a forecast sampler on a series store")
    spec = dict(options.holdout)
    known = {"path", "entity_col", "time_col", "value_cols", "partial"}
    unknown = sorted(set(spec) - known)
    if unknown or "path" not in spec:
        raise ValueError(
            "eval.holdout needs path (and optionally entity_col, time_col, value_cols, "
            f"partial); "
            f"got {sorted(spec)}"
        )

    return HoldoutReader(
        path=spec["path"],
        store=store,
        entity_col=spec.get("entity_col", "entity_id"),
        time_col=spec.get("time_col", store.metadata.get("time_col", "time")),
        value_cols=spec.get("value_cols"),
        partial=bool(spec.get("partial", False)),
    )
