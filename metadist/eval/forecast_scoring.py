"""Scoring forecasts on a store: original units, the naive baselines, the figure's examples.

`ForecastScorer` scores each task's one query window (the last H steps after its
`split_time`) in the store's original units, next to the naive, seasonal-naive, naive 2
and Theta forecasts of the task's history (and ETS and forecast combinations when asked
for; `metadist.eval.statistical` computes them on every core), and keeps a few forecasts
for the report's figure. With `eval.learned_combination`, every task's validation window
(the last H points of its history) is forecast too, and the tasks are scored once all
are in (`finish`): the learned combination's weights come from every task's validation
window (`metadist.eval.learned_scoring`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from metadist.batch import MetaBatch
from metadist.eval import metrics
from metadist.eval.learned_scoring import METHOD as LEARNED
from metadist.eval.learned_scoring import ValidationCollector
from metadist.eval.settings import EvalOptions, combination_key, combination_label
from metadist.eval.statistical import Pending, StatisticalForecasts
from metadist.eval.task_scores import TaskScores, diverged_rows, reference_scale
from metadist.tasks.inference import ForecastWindows

# A batch started: its tasks, their statistical forecasts (the evaluated horizon's, then
# the validation windows' where a learned combination is scored) and the validation
# windows (`ValidationCollector.validation_jobs`, or None).
_Started = tuple[list["_Task"], Pending, Any]


@dataclass
class _Task:
    """One forecast task: its entity, groups and history `[t, T]` in original units."""

    entity: int
    stratum: str
    label: str
    history: np.ndarray
    period: int = 1


class ForecastScorer:
    """Scores forecast tasks of `store` into a `TaskScores`, one batch at a time.

    `start(batch)` reads the histories of the batch's tasks and starts their statistical
    forecasts (`StatisticalForecasts`: on every core, while the caller predicts with the
    networks); calling the scorer with the batch's predictions then scores it. Batches are
    scored in the order they were started (a batch not started is started then).

    Args:
        store: the `SeriesStore` the tasks come from (its scaler is inverted).
        target_columns: store column index of each of the T targets.
        options: evaluation settings (seasonal periods, combinations, examples drawn).
        methods: the methods scored (`ets` among them adds AutoETS).
        statistical: computes the statistical forecasts (default: on every core, without a
            cache).
        learner: the meta-trained learner, for its forecasts of the validation windows
            (`eval.learned_combination`).
        windows: the run's forecast windows (`metadist.tasks.inference`), likewise.
    """

    def __init__(
        self,
        store: Any,
        target_columns: list[int],
        options: EvalOptions,
        methods: list[str] | None = None,
        statistical: StatisticalForecasts | None = None,
        learner: Any = None,
        windows: ForecastWindows | None = None,
    ) -> None:
        self.store = store
        self.columns = list(target_columns)
        self.options = options
        self.statistical = statistical or StatisticalForecasts(methods or [])
        self._started: deque[_Started] = deque()
        self.learned = (
            None
            if options.learned_combination is None
            else ValidationCollector(options.learned_combination, store, options, learner, windows)
        )
        # batches held back until the learned combination's weights are fitted
        self._held: list[tuple[list[_Task], np.ndarray, dict[str, np.ndarray]]] = []
        self._scores: TaskScores | None = None
        # Forecasts for the figure: tasks of a stratum or label not drawn yet, then others.
        self._examples: list[dict[str, Any]] = []
        self._spare: list[dict[str, Any]] = []
        self._seen: set[tuple[str, str]] = set()

    def examples(self) -> list[dict[str, Any]]:
        """Up to `options.num_examples` forecasts for the figure, new strata/labels first."""
        return (self._examples + self._spare)[: self.options.num_examples]

    def start(self, batch: MetaBatch) -> None:
        """Reads the histories of the batch's tasks and starts their statistical forecasts.

        Raises:
            ValueError: several query windows per task.
        """
        query_y = batch.query.y
        if query_y.dim() != 4 or query_y.shape[1] != 1:
            raise ValueError(
                "forecast evaluation scores one query window per task (the last H steps of "
                f"the entity, split='end'); got query.y of shape {tuple(query_y.shape)} — set "
                "the sampler's num_query to 1"
            )
        horizon = int(query_y.shape[2])
        tasks = []
        for entity, split_time in zip(
            batch.entity_index.cpu().numpy(), batch.split_time.cpu().numpy(), strict=True
        ):
            stratum, label = self._stratum_and_label(int(entity))
            history = self._history(int(entity), split_time)
            period = self.options.period_of(stratum, label)
            tasks.append(_Task(int(entity), stratum, label, history, period))
        jobs = [(t.history, horizon, t.period) for t in tasks]
        validation = None
        if self.learned is not None:
            validation = self.learned.validation_jobs([t.history for t in tasks], horizon)
            jobs += [(h, horizon, t.period) for h, t in zip(validation[0], tasks, strict=True)]
        self._started.append((tasks, self.statistical.start(jobs), validation))

    def close(self) -> None:
        """Stops the statistical forecasts' workers."""
        self.statistical.close()

    def __call__(
        self, scores: TaskScores, batch: MetaBatch, predictions: dict[str, np.ndarray]
    ) -> None:
        """Adds the batch's tasks to `scores`: `predictions {method: [B, 1, H, T]}`, scaled.

        Raises:
            ValueError: several query windows per task.
        """
        if not self._started:
            self.start(batch)
        tasks, pending, validation = self._started.popleft()
        statistical = self.statistical.collect(pending)
        if self.learned is not None:
            self.learned.add(
                [t.entity for t in tasks],
                [len(t.history) for t in tasks],
                [t.period for t in tasks],
                validation,
                statistical[len(tasks) :],
                self._inverse,
            )
            statistical = statistical[: len(tasks)]
        index = batch.entity_index.cpu().numpy()[:, None, None]
        truth = self._inverse(batch.query.y.cpu().numpy().astype(np.float64), index)[:, 0]
        model_forecasts = {
            k: self._inverse(v.astype(np.float64), index)[:, 0] for k, v in predictions.items()
        }
        forecasts = {
            **model_forecasts,
            **{m: np.stack([s[m] for s in statistical]) for m in statistical[0]},
        }
        if self.learned is None:
            self._score_tasks(scores, tasks, truth, forecasts)
        else:  # scored by `finish`, once every validation window is in
            self._held.append((tasks, truth, forecasts))
            self._scores = scores

    def finish(self, counter: Any = None) -> None:
        """Scores the batches held back for the learned combination, with the weights
        learned from every task's validation window (`counter`: a `metadist.progress`
        counter advanced by each of its `learned.num_fits()` fits)."""
        if self.learned is None:
            return
        self.learned.fit(self.options.seed, None if counter is None else lambda: counter.advance(1))
        for tasks, truth, forecasts in self._held:
            histories = [t.history for t in tasks]
            forecasts[LEARNED] = self.learned.combine(
                histories, [t.period for t in tasks], forecasts
            )
            assert self._scores is not None  # set with the first batch held
            self._score_tasks(self._scores, tasks, truth, forecasts)
        self._held.clear()

    def settings(self) -> dict[str, Any]:
        """What the report's settings say of the learned combination (its fit)."""
        return {} if self.learned is None else {"learned_combination": self.learned.summary()}

    def _inverse(self, values: np.ndarray, index: Any) -> np.ndarray:
        return self.store.scaler.inverse(values, index, self.columns)

    def _score_tasks(
        self,
        scores: TaskScores,
        tasks: list[_Task],
        truth: np.ndarray,
        forecasts: dict[str, np.ndarray],
    ) -> None:
        """Scores a batch's tasks: `truth [B, H, T]`, `forecasts {method: [B, H, T]}` in
        original units (the networks' and the statistical baselines'), each metric
        computed for the whole batch at once and summed task by task."""
        periods = [t.period for t in tasks]
        for combination in self.options.combinations or []:
            forecasts[combination_key(combination)] = np.mean(
                [forecasts[m] for m in combination], axis=0
            )
        references = np.array([reference_scale(t.history) for t in tasks])
        failed = {m: diverged_rows(forecasts[m], references) for m in scores.methods}
        for method, members in self._members(scores.methods).items():
            # a mean with a diverged member in it is that member averaged in, not a forecast
            for member in members:
                failed[method] = failed[method] | failed[member]
        scale = np.stack(
            [
                _mase_scale(t.history, m, len(self.columns))
                for t, m in zip(tasks, periods, strict=True)
            ]
        )
        sums = _metric_sums(truth, forecasts, scale, scores.methods)
        for b, task in enumerate(tasks):
            entity_id = self.store.entity_ids[task.entity]
            groups = {"stratum": task.stratum, "label": task.label, "entity": str(entity_id)}
            task_sums = {m: {k: float(v[b]) for k, v in sums[m].items()} for m in scores.methods}
            task_failed = {m: bool(failed[m][b]) for m in scores.methods}
            scores.add(task_sums, truth[b].size, groups, task_failed)
            task_forecasts = {m: v[b] for m, v in forecasts.items()}
            scores.add_points(groups, truth[b], task_forecasts)
            self._draw(
                entity_id, task.stratum, task.label, task.history, truth[b], task_forecasts,
                periods[b],
            )  # fmt: skip

    def _members(self, methods: list[str]) -> dict[str, list[str]]:
        """`{combination: the scored methods it averages}` of the combinations scored
        (the learned one's candidates: every candidate weighs more than 0)."""
        members = {combination_key(c): list(c) for c in self.options.combinations or []}
        if self.learned is not None:
            members[LEARNED] = list(self.learned.candidates)
        return {k: [m for m in v if m in methods] for k, v in members.items() if k in methods}

    def _history(self, entity: int, split_time: Any) -> np.ndarray:
        """`[t, T]` the entity's target values before `split_time`, in original units."""
        times = self.store.series_times(entity)
        num_history = int(np.searchsorted(times, split_time, side="left"))
        scaled = np.asarray(self.store.series(entity)[:num_history][:, self.columns], np.float64)
        return self.store.scaler.inverse(scaled, entity, self.columns)

    def _stratum_and_label(self, entity: int) -> tuple[str, str]:
        store = self.store
        stratum_names, label_names = store.stratum_names, store.label_names
        stratum = str(stratum_names[store.stratum_codes[entity]]) if len(stratum_names) else ""
        label = str(label_names[store.label_codes[entity]]) if len(label_names) else ""
        return stratum, label

    def _draw(
        self,
        entity_id: Any,
        stratum: str,
        label: str,
        history: np.ndarray,
        truth: np.ndarray,
        forecasts: dict[str, np.ndarray],
        period: int,
    ) -> None:
        """Keeps the task for the figure: first the tasks that show a stratum or label not
        drawn yet, then any."""
        values = {("stratum", stratum), ("label", label)}
        drawn = self._spare if values <= self._seen else self._examples
        if len(drawn) >= self.options.num_examples:
            return
        self._seen.update(values)
        tail = max(3 * truth.shape[0], 2 * period, 24)
        tags = ", ".join(v for v in (stratum, label) if v)
        example = {
            "title": f"{entity_id} ({tags})" if tags else str(entity_id),
            "history": history[-tail:, 0],
            "truth": truth[:, 0],
            "unadapted": forecasts["unadapted"][:, 0],
            "adapted": forecasts["adapted"][:, 0],
        }
        if self.options.combinations:  # the first combination joins the figure
            first = self.options.combinations[0]
            example["combination"] = forecasts[combination_key(first)][:, 0]
            example["combination_label"] = combination_label(first)
        drawn.append(example)


def _mase_scale(history: np.ndarray, period: int, num_targets: int) -> np.ndarray:
    """`[T]` MASE's scale of each target: the mean absolute seasonal difference of
    `history [t, T]`; NaN where the history is no longer than one season."""
    try:
        return np.asarray(metrics.seasonal_scale(history, period), dtype=np.float64)
    except ValueError:  # history no longer than one season: MASE undefined
        return np.full(num_targets, np.nan)


def _metric_sums(
    truth: np.ndarray,
    forecasts: dict[str, np.ndarray],
    scale: np.ndarray,
    methods: list[str],
) -> dict[str, dict[str, np.ndarray]]:
    """`{method: {metric: [B] sums over each task's points}}` of `forecasts {method:
    [B, H, T]}` against `truth [B, H, T]`; MASE's absolute errors are divided by `scale
    [B, T]`. Each task's sum is that of its own points, as one task alone would give."""
    sums = {}
    num_tasks = truth.shape[0]

    def per_task(terms: np.ndarray) -> np.ndarray:
        return terms.reshape(num_tasks, -1).sum(axis=1)

    for method in methods:
        forecast = forecasts[method]
        sums[method] = {
            metric: per_task(metrics.point_terms(metric, truth, forecast, scale[:, None]))
            for metric in metrics.POINT_METRICS
        }
    return sums
