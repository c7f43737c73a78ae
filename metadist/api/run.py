"""A trained run, loaded to adapt to new data: `load_run` and the `Run` it returns."""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa

from metadist.api import arguments, classification, forecasting
from metadist.api.artifact import load_parts
from metadist.api.classification import Examples
from metadist.api.history import History
from metadist.api.protocols import AdaptingLearner
from metadist.eval.competition_member import is_competition_member
from metadist.eval.plausibility import GUARD_FILE, recorded_guard, recorded_model
from metadist.eval.settings import EvalOptions
from metadist.train.build import TaskSource
from metadist.train.config import TrainConfig


def load_run(
    run_dir: str | os.PathLike,
    *,
    ensemble: Sequence[str | os.PathLike] | None = None,
    store: str | os.PathLike | None = None,
    allow_imports: Collection[str] = (),
) -> Run:
    """A training run's checkpoint, ready to adapt and predict: the one model selection
    kept (`checkpoints/best`, chosen on meta-val) where the run has one, else the latest.

    Args:
        run_dir: a run directory written by `metadist train`.
        ensemble: other runs of the same data and sampler to average with it (as
            `eval.ensemble`; one path is one run); default: the run's own evaluation
            settings.
        store: the series store to read the scaling rule and columns from, if it moved
            since training (default: where the run's `inference.json` says it is,
            relative to the run directory, else the run's `data.store`). Without a
            store, a run forecasts from its own record of it (`inference.json`): the
            store is needed only to evaluate the run on its held-out split.
        allow_imports: modules the run's config lists in `imports` that may be imported:
            a loaded run is data, not code, and imports nothing else (a module already
            imported needs no allowing); one name is one module.

    Raises:
        FileNotFoundError: no run, no checkpoint, or neither its store nor its record.
        ValueError: a run whose store no longer matches its checkpoint, or an argument
            of the wrong type (naming it).
    """
    path, config, learner, source, options = load_parts(
        arguments.run_path("run_dir", run_dir),
        ensemble=arguments.run_paths("ensemble", ensemble),
        store=None if store is None else arguments.run_path("store", store),
        allow_imports=arguments.module_names("allow_imports", allow_imports),
    )
    # a Learner or a LearnerEnsemble: both adapt and predict
    return Run(path, config, cast(AdaptingLearner, learner), source, options)


@dataclass
class Run:
    """A trained run (what `load_run` returns).

    Attributes:
        run_dir: where it lives.
        config: its `TrainConfig`.
        learner: the meta-trained learner (an ensemble with `ensemble`), in eval mode.
        source: its store, sampler and shapes (`metadist.train.build.TaskSource`); for
            a run whose store is gone, the run's record of them (`store` a
            `RecordedStore`, `sampler` a `RecordedSampler`, no `partitioner`).
        eval_options: its evaluation settings (`EvalOptions`): adaptation steps, seasonal
            periods of the baselines.
    """

    run_dir: Path
    config: TrainConfig
    learner: AdaptingLearner
    source: TaskSource
    eval_options: EvalOptions

    def __repr__(self) -> str:
        """One line: where the run is, what it is and what it was trained on (the
        fields themselves are attributes)."""
        store = self.source.store
        if store is None:
            where = ""
        elif hasattr(store, "entity_ids"):  # the store itself
            where = f", store {str(store.path)!r}"
        else:  # its record in the run (`RecordedStore`)
            use = {"forecast": "forecasts", "classification": "classifies"}.get(self.kind)
            where = f", store gone: {use} from its record" if use else ", store gone"
        return (
            f"Run({str(self.run_dir)!r}, {self.kind}: {self.config.learner.name} on "
            f"{self.config.model.name}, sampler {self.config.sampler.name}{where})"
        )

    @property
    def kind(self) -> str:
        """`forecast` for forecasting runs on a store, `classification` for few-shot
        classifiers, `other` for anything else (e.g. sinusoid regression)."""
        if getattr(self.learner, "loss", "mse") == "cross_entropy":
            return "classification"
        if hasattr(self.source.sampler, "horizon") and self.source.store is not None:
            return "forecast"
        return "other"

    def _kind_named(self) -> str:
        """What the run is, for messages: "a classification run", "a forecasting run", or
        for another kind its sampler ("a run of the sinusoid sampler without a store")."""
        if self.kind == "other":
            store = "without a series store" if self.source.store is None else "on a store"
            return f"a run of the {self.config.sampler.name} sampler {store}"
        return "a forecasting run" if self.kind == "forecast" else "a classification run"

    def forecast(
        self,
        history: History,
        *,
        horizon: int | None = None,
        methods: Sequence[str] | None = None,
        period: int | None = None,
        steps: int | None = None,
        guard: bool = True,
        progress: bool | None = None,
    ) -> pa.Table:
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
                `eval.combinations` scores it). Default: `adapted`, or, for a
                competition's run whose validation chose for its horizon (`guard.json`'s
                `model`), the one chosen (`adapted` or `unadapted`), said on stderr.
            period: the seasonal period m of `seasonal_naive` and `theta` (default: the
                run's `eval.seasonal_period`; a mapping by stratum or label is looked up
                with the entity's stratum or label column, where the history has it).
            steps: adaptation steps (default: the run's evaluation setting, else the
                learner's `eval_inner_steps`).
            guard: apply the plausibility guard the run records (`guard.json`, written
                by `metadist competition` where validation chose a band width): the
                model's forecasts (`adapted`, `unadapted` and combinations with them)
                are clipped to each entity's band from its own history
                (`metadist.eval.plausibility`), as the competition scored them; a line
                on stderr counts the clipped points. False: the model unguarded.
            progress: show the entities read, adapted and forecast by the baselines
                (default: bars on a terminal, else a line every 15 s while it lasts;
                False: nothing).

        An entity shorter than the run's support windows need (L + H + (K-1)·stride -
        pad_inputs rows) is front-filled with its first row and adapted on fewer
        windows, with one line on stderr naming it; a competition's member run cuts
        every entity so, as the competition's holdout evaluation did.

        Returns:
            A pyarrow Table in long format, one row per entity, step and method: the
            entity column (in the history's type), `step` (1..horizon), the time column (the last time plus
            `step` times the history's regular spacing, where it is regular), `method`,
            and one column per forecast target in the entity's original units; with a
            guard applied, also `clipped` (bool: the guard moved that model forecast).
            Where the store has a column of one of those three names, that one is
            `forecast_<name>` (`forecast_step`, ...). A model forecast that is not
            finite (its adaptation diverged) is NaN in all its rows, and one line on
            stderr names the entities of each method.

        Raises:
            ValueError: a missing column, a duplicated time, irregular or gapped times, a
                time beyond the years 1677 to 2262, a non-finite value the store's NaN
                rule does not allow (or, under `drop`, a history that ends in dropped
                rows), an unknown or repeated method, or a run that does not forecast (a
                classifier, a run without a store, or a sampler without the forecasting
                protocol of `metadist.tasks.inference`); the message names it.
        """
        store = self.source.store
        if self.kind != "forecast" or store is None:
            raise ValueError(
                f"run {self.run_dir} is {self._kind_named()}: it cannot forecast; forecasting needs "
                "a run of a sampler of forecast windows on a series store"
            )
        if period is not None:
            period = _whole("period", period, least=1)
        if methods is None:
            methods = (self.chosen_model() or "adapted",)
        return forecasting.forecast(
            self.learner,
            self.source.sampler,
            store,
            self.eval_options,
            history,
            horizon=horizon,
            methods=methods,
            period=period,
            steps=steps,
            # the band validation chose, if any
            guard_width=recorded_guard(self.run_dir) if guard else None,
            holdout_padding=is_competition_member(self.run_dir),
            progress=progress,
        )

    def chosen_model(self) -> str | None:
        """`adapted` or `unadapted`: the forecast a competition's validation chose as the
        model of this run's horizon (recorded in `guard.json`), said on stderr; None
        where the run records no choice."""
        model = recorded_model(self.run_dir)
        if model is not None:
            print(
                f"note: forecasting with {model}, the model the competition chose on "
                f"validation for this horizon ({self.run_dir / GUARD_FILE}); methods= "
                "(--methods) overrides it",
                file=sys.stderr,
            )
        return model

    def classify(
        self,
        support_x: Examples,
        support_labels: Sequence[Hashable],
        query_x: Examples,
        *,
        steps: int | None = None,
    ) -> np.ndarray:
        """Labels of `query_x`, learned from a few labelled examples of new classes.

        Args:
            support_x: the labelled examples: a list of `[T, F]` (or `[T]`) arrays of the
                store's columns in original units, or one `[N, T, F]` array (a single
                `[T, F]` array is one example).
            support_labels: their labels (any hashable values; at least two classes).
            query_x: the examples to label, in the same form.
            steps: adaptation steps (default: the run's evaluation setting).

        Returns:
            `[M]` array of the predicted labels (values of `support_labels`).

        Raises:
            ValueError: a run that does not classify, mismatched lengths, fewer than two
                classes (or more than the ways of a run whose head has a row per way:
                MAML and the other inner-loop learners), an empty example, an argument of
                another shape, a NaN or inf the store's NaN rule does not allow (examples
                get the rule as ingest applied it: `ffill` fills, `drop` drops the row), a
                value the store's scaling cannot hold, or labels given as one string or
                unhashable (a list).
        """
        if self.kind != "classification":
            raise ValueError(f"run {self.run_dir} is {self._kind_named()}, not a classifier")
        if self.source.store is None:
            raise ValueError(
                f"run {self.run_dir} has no store schema: classify reads examples in a "
                "store's columns"
            )
        if steps is not None:
            steps = _whole("steps", steps, least=0)
        # a network whose head has a row per way (MAML and the other inner-loop learners)
        # labels at most the ways it was trained with; a prototype learner any number
        members = getattr(self.learner, "members", [self.learner])  # an ensemble's too
        fixed = any(getattr(member, "has_inner_loop", False) for member in members)
        return classification.classify(
            self.learner,
            self.source.sampler,
            self.source.store,
            support_x,
            support_labels,
            query_x,
            self.eval_options.inner_steps if steps is None else steps,
            max_classes=int(self.source.output_shape[-1]) if fixed else None,
        )


def _whole(name: str, value: Any, least: int) -> int:
    """`value` as an int (a numpy integer too).

    Raises:
        ValueError: not an integer >= `least` (a bool, a float, a smaller one), named.
    """
    try:
        whole = operator.index(value)
    except TypeError:
        whole = least - 1
    if isinstance(value, (bool, np.bool_)) or whole < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return whole
