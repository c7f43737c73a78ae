"""Evaluation settings: which split, which methods and metrics, how many tasks.

`EvalOptions` is the typed `eval` section of an experiment (`experiments/eval/`), validated
where it is built; `load_eval_options` composes it with `eval.KEY=VALUE` overrides.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from metadist.eval.table_settings import check_table_names
from metadist.options import check_range, from_mapping
from metadist.train.compose import find_experiments_dir, whole_eval_mappings
from metadist.train.config import check_finite_numbers

FORECAST_METHODS = {
    "adapted": "meta-trained + adapted",
    "unadapted": "meta-trained, no adaptation",
    "scratch": "same network from scratch on support",
    "naive": "naive (last value)",
    "seasonal_naive": "seasonal naive",
    "naive2": "naive 2 (seasonally adjusted)",
    "theta": "Theta method",
    "ets": "ETS (AutoETS)",
    "fforma": "learned combination (FFORMA weights from series features, fit on validation)",
}
# The learned combination's method name (`eval.learned_combination`); it cannot itself
# be a member of a combination.
LEARNED_METHOD = "fforma"
# Baselines scored only when asked for (`eval.extra_baselines`): they need an optional
# package or take long.
EXTRA_BASELINES = ("ets",)
CLASSIFICATION_METHODS = {
    "adapted": "meta-trained + adapted",
    "unadapted": "meta-trained, no adaptation",
    "scratch": "same backbone from scratch on support",
    "nearest_centroid": "nearest centroid (z-normalised raw)",
    "one_nn": "1-NN, Euclidean (z-normalised raw)",
    "pretrained": "pretrained embedding + nearest centroid",
    "baseline_pp": "Baseline++ (pretrained, cosine head on support)",
}
FORECAST_METRICS = ("smape", "mape", "mase", "mae", "mse")
# Metrics derived from the pooled ones (not summed per task): OWA, the mean of sMAPE and
# MASE relative to naive 2's, as the M4 competition ranks methods.
DERIVED_METRICS = ("owa",)
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
    "naive2": "naive 2",
    "theta": "Theta",
    "ets": "ETS",
}


@dataclass
class EvalOptions:
    """How a run is evaluated (the `eval` section of an experiment config).

    Attributes:
        inner_steps: adaptation steps on each support set; `None` uses the learner's
            `eval_inner_steps`.
        scratch_steps: Adam steps of the from-scratch baseline on each support set (0:
            no such baseline).
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
            `seasonal_naive`, `naive2`, `theta`, `ets`) whose forecasts are averaged point
            by point in original units, e.g. `[[adapted, theta]]`, named `adapted+theta`.
            Forecasting on a store only; `None`: none.
        learned_combination: the candidates of a learned forecast combination scored as
            the method `fforma` (FFORMA: softmax weights per series from its features,
            learned on each series' validation window, the last H points of its
            history; `metadist.eval.learned_combination`), e.g. `[adapted, theta,
            seasonal_naive, naive]` (`ets` where it is scored). Forecasting on a store
            only; `None`: not scored.
        extra_baselines: forecast baselines scored besides naive, seasonal naive, naive 2
            and Theta: `ets` (AutoETS; needs statsforecast, the `ets` extra).
        checkpoint: the run's checkpoint evaluated: `best` (its best on meta-val,
            `checkpoints/best`, where it has one; else its latest) or `latest`.
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
    learned_combination: list[str] | None = None
    extra_baselines: list[str] = field(default_factory=list)
    checkpoint: str = "best"

    def validate(self) -> None:
        """Raises `ValueError` naming the first bad field."""
        for check in _CHECKS:
            check(self)

    def period_of(self, stratum: str, label: str = "") -> int:
        """m for a task of `stratum` / `label`.

        Raises:
            ValueError: `seasonal_period` is a mapping without an entry for the task.
        """
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
        """Options from a plain mapping (the composed `eval` section).

        Raises:
            ValueError: an unknown field (naming `eval.<key>` and the closest field), a
                value of the wrong type or a bad value.
        """
        check_finite_numbers({"eval": dict(values)})
        options = from_mapping(cls, values, "eval")
        options.validate()
        return options


def _check_training_steps(options: EvalOptions) -> None:
    """eval.inner_steps, the from-scratch and pretraining baselines' steps and rates."""
    if options.inner_steps is not None and options.inner_steps < 0:
        raise ValueError(f"eval.inner_steps must be >= 0 or null, got {options.inner_steps}")
    if options.scratch_steps < 0:
        raise ValueError(f"eval.scratch_steps must be >= 0, got {options.scratch_steps}")
    if not options.scratch_lr > 0:
        raise ValueError(f"eval.scratch_lr must be > 0, got {options.scratch_lr}")
    if options.pretrain_steps < 0:
        raise ValueError(f"eval.pretrain_steps must be >= 0, got {options.pretrain_steps}")
    if not options.pretrain_lr > 0:
        raise ValueError(f"eval.pretrain_lr must be > 0, got {options.pretrain_lr}")
    if options.pretrain_batch_size < 1:
        raise ValueError(
            f"eval.pretrain_batch_size must be >= 1, got {options.pretrain_batch_size}"
        )


def _check_seasonal_periods(options: EvalOptions) -> None:
    """eval.seasonal_period: one integer >= 1, or a mapping to them."""
    periods = (
        options.seasonal_period.values()
        if isinstance(options.seasonal_period, dict)
        else [options.seasonal_period]
    )
    for m in periods:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"eval.seasonal_period values must be integers >= 1, got {m!r}")


def _check_task_selection(options: EvalOptions) -> None:
    """eval.batch_size, max_tasks, tasks_per_unit, num_examples, split, seed and
    checkpoint."""
    if options.checkpoint not in ("best", "latest"):
        raise ValueError(f"eval.checkpoint must be 'best' or 'latest', got {options.checkpoint!r}")
    if options.batch_size < 1:
        raise ValueError(f"eval.batch_size must be >= 1, got {options.batch_size}")
    if options.max_tasks is not None and options.max_tasks < 1:
        raise ValueError(f"eval.max_tasks must be >= 1 or null, got {options.max_tasks}")
    if (
        isinstance(options.tasks_per_unit, bool)
        or not isinstance(options.tasks_per_unit, int)
        or (options.tasks_per_unit < 1)
    ):
        raise ValueError(
            f"eval.tasks_per_unit must be an integer >= 1, got {options.tasks_per_unit!r}"
        )
    if options.num_examples < 0:
        raise ValueError(f"eval.num_examples must be >= 0, got {options.num_examples}")
    if options.split not in ("test", "val", "all"):
        raise ValueError(f"eval.split must be 'test', 'val' or 'all', got {options.split!r}")
    # the tasks' streams take it as trainer.seed (seed * 2**32 in 64 bits)
    check_range("eval.seed", options.seed, 0, 2**32 - 1, "a 32-bit seed, as trainer.seed")


def _check_tables(options: EvalOptions) -> None:
    """eval.primary_metric and group_by."""
    if options.primary_metric not in FORECAST_METRICS:
        raise ValueError(
            f"eval.primary_metric must be one of {', '.join(FORECAST_METRICS)}, got "
            f"{options.primary_metric!r}"
        )
    for grouping in options.group_by:
        if grouping not in ("stratum", "label"):
            raise ValueError(f"eval.group_by entries must be stratum or label, got {grouping!r}")


def _check_subsets(options: EvalOptions) -> None:
    """eval.labels, ensemble and ensemble_reduce."""
    if options.labels is not None and (
        isinstance(options.labels, str) or not options.labels or not all(options.labels)
    ):
        raise ValueError(
            f"eval.labels must be a non-empty list of labels or null, got {options.labels!r}"
        )
    if options.ensemble is not None and (
        isinstance(options.ensemble, str) or not all(isinstance(p, str) for p in options.ensemble)
    ):
        raise ValueError(
            f"eval.ensemble must be a list of run directories or null, got {options.ensemble!r}"
        )
    if options.ensemble_reduce not in ("mean", "median"):
        raise ValueError(
            f"eval.ensemble_reduce must be 'mean' or 'median', got {options.ensemble_reduce!r}"
        )


def _check_combinations(options: EvalOptions) -> None:
    """eval.combinations: lists of two or more forecast methods, no two alike."""
    if options.combinations is not None and not isinstance(options.combinations, (list, tuple)):
        raise ValueError(
            "eval.combinations must be a list of method lists or null, e.g. "
            f"[[adapted, theta]], got {options.combinations!r}"
        )
    for combination in options.combinations or []:
        _check_combination(combination)
    candidates = options.learned_combination
    if candidates is not None:
        if isinstance(candidates, str) or not isinstance(candidates, (list, tuple)):
            raise ValueError(
                "eval.learned_combination must be a list of forecast methods or null, e.g. "
                f"[adapted, theta, seasonal_naive, naive], got {candidates!r}"
            )
        _check_combination(candidates, "eval.learned_combination")
    if options.combinations and len({frozenset(c) for c in options.combinations}) < len(
        options.combinations
    ):
        raise ValueError(
            "eval.combinations lists the same methods twice (in any order), got "
            f"{options.combinations!r}"
        )


def _check_extra_baselines(options: EvalOptions) -> None:
    """eval.extra_baselines: known optional baselines."""
    for name in options.extra_baselines:
        if name not in EXTRA_BASELINES:
            raise ValueError(
                f"eval.extra_baselines: unknown baseline {name!r}; choose from "
                f"{', '.join(EXTRA_BASELINES)}"
            )


def _check_seasonal_period_from(options: EvalOptions) -> None:
    """eval.seasonal_period_from: stratum or label."""
    if options.seasonal_period_from not in ("stratum", "label"):
        raise ValueError(
            "eval.seasonal_period_from must be 'stratum' or 'label', got "
            f"{options.seasonal_period_from!r}"
        )


# The checks of `validate`, in order: it reports the first bad field it finds.
_CHECKS = (
    _check_training_steps,
    _check_seasonal_periods,
    _check_task_selection,
    _check_tables,
    _check_subsets,
    _check_combinations,
    _check_extra_baselines,
    _check_seasonal_period_from,
    check_table_names,
)


def check_periods_cover(options: EvalOptions, store: Any) -> None:
    """Where `eval.seasonal_period` maps strata (or labels) to periods, every stratum
    (label) of `store`'s entities has one (of those with one of `eval.labels`, where it
    is set; every split's, since the partition is not known yet): checked before the
    training and the evaluation, not when its first task is scored. An experiment's mapping names the
    strata of its own data, so another store gets one line saying what to set.

    Raises:
        ValueError: naming the store's strata (labels) the mapping leaves out.
    """
    periods, kind = options.seasonal_period, options.seasonal_period_from
    if store is None or not isinstance(periods, dict):
        return
    if options.labels is not None:  # the entities evaluated: those with these labels
        try:
            chosen = store.has_label(options.labels)
        except ValueError as error:
            raise ValueError(f"eval.labels: {error}") from None
        values = store.strata[chosen] if kind == "stratum" else store.labels[chosen]
        names = sorted({str(n) for n in values})
    else:
        names = [str(n) for n in (store.stratum_names if kind == "stratum" else store.label_names)]
    missing = [n for n in names if n not in periods]
    if not missing:
        return
    known = ", ".join(sorted(map(str, periods)))
    kinds = "strata" if kind == "stratum" else f"{kind}s"
    what = (
        f"has no {kind} column"
        if missing == [""]
        else f"has {kinds} it does not name ({', '.join(missing[:5])}"
        + (" ..." if len(missing) > 5 else "")
        + ")"
    )
    example = "" if missing == [""] else f", e.g. 'eval.seasonal_period={{{missing[0]}: 12}}'"
    raise ValueError(
        f"eval.seasonal_period gives the periods of the {kinds} {known}, but store "
        f"{store.path} {what}: set eval.seasonal_period=M (one period for every series) "
        f"or a mapping of its {kind}s{example}"
    )


def combination_key(methods: Iterable[str]) -> str:
    """The method name of a forecast combination: its members joined by `+`."""
    return "+".join(methods)


def combination_label(methods: Iterable[str]) -> str:
    """A combination's row label, e.g. "mean of adapted model and Theta"."""
    names = [_SHORT_NAMES[m] for m in methods]
    return "mean of " + ", ".join(names[:-1]) + " and " + names[-1]


def _check_combination(combination: Any, field: str = "eval.combinations") -> None:
    if not isinstance(combination, (list, tuple)):
        raise ValueError(
            f"eval.combinations entries must be lists of methods, got {combination!r} "
            "(write [[adapted, theta]], not [adapted, theta])"
        )
    members = [m for m in FORECAST_METHODS if m != LEARNED_METHOD]
    unknown = [m for m in combination if m not in members]
    if unknown:
        raise ValueError(
            f"{field}: unknown method {unknown[0]!r} in {list(combination)}; "
            f"methods: {', '.join(members)}"
        )
    if len(set(combination)) < 2 or len(set(combination)) < len(combination):
        raise ValueError(
            f"{field}: a combination needs two or more different methods, got {list(combination)}"
        )


def split_eval_overrides(overrides: Iterable[str]) -> tuple[list[str], list[str]]:
    """(training overrides, `eval.KEY=VALUE` overrides) of a command line."""
    overrides = list(overrides)
    return (
        [o for o in overrides if not o.startswith("eval.")],
        [o for o in overrides if o.startswith("eval.")],
    )


def eval_settings_file(experiment: str, config_dir: str | None = None) -> Path | None:
    """The file a run without recorded settings is evaluated with:
    `experiments/eval/<experiment>.yaml`, else `experiments/eval/default.yaml`, else None
    (the `EvalOptions` defaults), in the experiments directory training would find."""
    with contextlib.suppress(FileNotFoundError):
        eval_dir = find_experiments_dir(config_dir) / "eval"
        for name in (experiment, "default"):
            if (eval_dir / f"{name}.yaml").is_file():
                return eval_dir / f"{name}.yaml"
    return None


def load_eval_options(
    experiment: str,
    overrides: Iterable[str] = (),
    config_dir: str | None = None,
    recorded: dict[str, Any] | None = None,
) -> EvalOptions:
    """The evaluation settings of a run, with `eval.KEY=VALUE` overrides applied.

    They are `recorded` (the `eval` section a run saved with its config, so re-scoring a
    run does not depend on which config files are found) when given; else read from
    `experiments/eval/<experiment>.yaml` if it exists, else `experiments/eval/default.yaml`,
    else the `EvalOptions` defaults (runs saved before evaluation joined the config).

    Raises:
        ValueError: an override not of the form `eval.KEY=VALUE`, or a bad field.
    """
    values: dict[str, Any] = dict(recorded or {})
    path = None if recorded else eval_settings_file(experiment, config_dir)
    if path is not None:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} must hold a mapping of eval settings")
        values = {str(key): value for key, value in loaded.items()}
    dotlist = []
    for override in overrides:
        key, sep, _ = override.partition("=")
        if not sep or not key.startswith("eval."):
            raise ValueError(f"evaluation override {override!r} must look like eval.KEY=VALUE")
        dotlist.append(override[len("eval.") :])
    if dotlist:
        merged = OmegaConf.merge(OmegaConf.create(values), OmegaConf.from_dotlist(dotlist))
        combined = OmegaConf.to_container(merged, resolve=True)
        assert isinstance(combined, dict)  # a mapping merged with a mapping
        values = {str(key): value for key, value in combined.items()}
        values.update(whole_eval_mappings(dotlist))  # given whole, not merged
    return EvalOptions.from_dict(values)
