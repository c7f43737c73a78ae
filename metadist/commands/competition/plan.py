"""What one call of `metadist competition` runs on, checked before any work: the data
set and its horizons, the holdout, the user's settings and overrides, the candidates a
validation run chooses among and the choices a test run reads (`Plan`, `plan_run`)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metadist.commands.competition.adaptation import read_adaptation_choice
from metadist.commands.competition.candidates import (
    candidate_experiments,
    candidate_heads,
    candidate_lengths,
    model_options,
)
from metadist.commands.competition.choice import candidate_losses, read_choices
from metadist.commands.competition.evaluation import evaluation_overrides, want_ets
from metadist.commands.competition.holdout import check_holdout, validation_split
from metadist.commands.competition.members import Group, groups_of
from metadist.commands.competition.output import (
    check_adaptation_source,
    check_output,
    claim_output,
)
from metadist.commands.competition.panels import (
    Panel,
    check_train_with,
    load_panels,
    with_panel_labels,
)
from metadist.commands.competition.series import SeriesInfo, scan_series
from metadist.commands.competition.spec import (
    TEST_FILE,
    TRAIN_FILE,
    VALIDATION_DIR,
    CompetitionSpec,
    default_output,
    load_spec,
    spec_dict,
)
from metadist.eval.settings import load_eval_options, split_eval_overrides
from metadist.learners import REGRESSION_LOSSES
from metadist.train.compose import compose_dict


@dataclass(frozen=True)
class Plan:
    """What one call runs on, checked before any work.

    Attributes:
        name: the data set's name.
        data_dir: where the training and holdout files are (the validation split's
            directory under the validation protocol).
        spec, info: the data set's settings and what the scan found in its training file.
        out: the output directory.
        horizons: the horizons run, ascending.
        chosen: per group (`Group.key`), the method a validation run chose
            (`--adaptation-from`).
        train_overrides, eval_overrides: the user's overrides, split (the data set's
            metric first among the eval overrides: `eval.primary_metric`).
        ets: whether AutoETS is scored.
        groups: the series each ensemble forecasts, in order of horizon.
        losses: the training losses (`--losses`, else the data set's metric where a loss
            of that name exists, else smape; under the validation protocol with
            candidates, the candidates).
        candidates: the losses one of which is chosen per group on this validation run
            (one ensemble each; empty: no choice, every loss in one ensemble).
        step_candidates: the shorter trainings tried beside the experiment's on this
            validation run (`trainer.meta_steps` each; `candidates.py`).
        head_candidates: the other starts of the output layer tried beside the
            experiment's on this validation run (`model.options.head_init` each).
        experiment_candidates: the other experiments tried beside the run's on this
            validation run, or those its validation run chose (name -> whether its model
            takes a seasonal period).
        choices: per group, what a validation run chose (`choice.py`: the loss trained,
            its length, the weight against seasonal naive), read with `--adaptation-from`.
        source: the data set's training file (under the validation protocol, the file
            the split was cut from), which the output's marker names.
        panels: the other data sets trained with (`--train-with`; `panels.py`).
    """

    name: str
    data_dir: Path
    spec: CompetitionSpec
    info: SeriesInfo
    out: Path
    horizons: list[int]
    chosen: dict[str, str] | None
    train_overrides: list[str]
    eval_overrides: list[str]
    ets: bool = False
    groups: tuple[Group, ...] = ()
    losses: tuple[str, ...] = ("smape",)
    candidates: tuple[str, ...] = ()
    choices: dict[str, dict] | None = None
    source: Path = Path()
    step_candidates: tuple[int, ...] = ()
    head_candidates: tuple[str, ...] = ()
    panels: tuple[Panel, ...] = ()
    experiment_candidates: dict[str, bool] = dataclasses.field(default_factory=dict)

    def losses_of(self, key: str) -> tuple[str, ...]:
        """The losses group `key` trains: the one a validation run chose, else `losses`."""
        return (str(self.choices[key]["loss"]),) if self.choices else self.losses

    def lookbacks_of(self, key: str, lookbacks: list[float]) -> list[float]:
        """The lookback multiples group `key` trains: those a validation run chose (where
        it recorded them), else `lookbacks` (`--lookbacks`)."""
        chosen = (self.choices or {}).get(key, {}).get("lookbacks")
        return list(chosen) if chosen else lookbacks

    def steps_of(self, key: str) -> tuple[int | None, ...]:
        """The training lengths group `key` trains (None: the experiment's): the one a
        validation run chose, else the experiment's and, on a validation run with
        candidates, the shorter `step_candidates`."""
        if self.choices:
            return (self.choices[key].get("steps"),)
        return (None, *self.step_candidates) if self.candidates else (None,)

    def heads_of(self, key: str) -> tuple[str | None, ...]:
        """The starts of the output layer group `key` trains (None: the experiment's): the
        one a validation run chose, else the experiment's and, on a validation run with
        candidates, the other `head_candidates`."""
        if self.choices:
            return (self.choices[key].get("head"),)
        return (None, *self.head_candidates) if self.candidates else (None,)

    def experiments_of(self, key: str) -> dict[str | None, bool]:
        """The experiments group `key` trains (None: the run's; each with whether its model
        takes a period): the one a validation run chose, else the run's and, on a
        validation run with candidates, the other `experiment_candidates`."""
        if self.choices:
            name = self.choices[key].get("experiment")
            return {name: True if name is None else self.experiment_candidates.get(name, True)}
        others: dict[str | None, bool] = {None: True}
        others.update(self.experiment_candidates.items())
        return others if self.candidates else {None: True}

    @property
    def test_path(self) -> Path:
        return self.data_dir / self.spec.test


def plan_run(args: argparse.Namespace) -> Plan:
    """The data set, its horizons, the holdout and the user's settings, all checked
    (the holdout against every series' horizon, the evaluation's settings of every
    horizon) before any work; under the validation protocol, the validation split is
    written (or confirmed) after those checks, before the holdout's.

    Raises:
        ValueError, FileNotFoundError: naming what does not fit.
    """
    data_dir: Path = args.data_dir
    if not data_dir.is_dir():
        raise FileNotFoundError(f"no data directory at {data_dir}")
    spec = load_spec(data_dir)
    name = spec.name or data_dir.resolve().name
    out: Path = args.out or default_output(spec, data_dir, "_val" if args.validation else "")
    source = data_dir / spec.train
    check_output(out, source, args.validation)  # before anything is written
    info = scan_series(data_dir / spec.train, spec)
    horizons = _horizons(info, args.horizons)
    train_overrides, eval_overrides = split_eval_overrides(args.overrides)
    refuse_owned_overrides(train_overrides)
    # the experiment's settings, composed once for the plan (a bad override is named here)
    composed = compose_dict([f"experiment={args.experiment}", *train_overrides])
    wanted = (args.experiment_candidates or []) if args.validation else []  # checked now
    recipe = args.experiment_candidates_from_recipe
    others = candidate_experiments(args.experiment, composed, wanted, train_overrides, recipe)
    panels = load_panels(getattr(args, "train_with", None) or [], name, source, spec, info)
    groups = groups_of(info, horizons, model_takes_period(composed))
    groups = with_panel_labels(groups, panels, args.validation)
    # the data set's own metric: the primary metric, and what the adaptation compares
    eval_overrides = [f"eval.primary_metric={spec.metric}", *eval_overrides]
    chosen = None
    if args.adaptation_from is not None:
        if args.validation:
            raise ValueError("--adaptation-from chooses for a test run; leave out --validation")
        check_adaptation_source(args.adaptation_from, source)
        chosen = read_adaptation_choice(
            args.adaptation_from, [g.key for g in groups], _primary_metric(args, eval_overrides)
        )
    check_train_with(out, panels, args.adaptation_from)
    # the user's eval overrides, checked now rather than after the training
    holdout = load_eval_options(args.experiment, eval_overrides).holdout or {}
    ets = want_ets(args.ets)
    test_path = data_dir / spec.test
    if args.validation:
        _check_validation_horizons(info, horizons)
        test_path = out / VALIDATION_DIR / TEST_FILE
    # what the evaluation of each horizon will be given, checked before the training
    for horizon in horizons:
        labels = info.labels_of(horizon)
        overrides = evaluation_overrides(spec, info, labels, test_path, [], ets, eval_overrides)
        load_eval_options(args.experiment, overrides)
    if args.validation:
        data_dir, spec, info = _validation_data(data_dir, spec, info, out)
    if not test_path.is_file():
        raise FileNotFoundError(f"no holdout file at {test_path}")
    _describe(name, info, spec, args.validation)
    partial = bool(holdout.get("partial"))
    check_holdout(test_path, spec, info, horizons, partial, not args.validation)
    losses = tuple(args.losses or [training_loss(spec.metric)])
    losses, candidates, choices = _loss_plan(args, spec, groups, losses, eval_overrides)
    step_candidates = candidate_lengths(args, composed) if candidates else ()
    head_candidates = candidate_heads(args, composed) if candidates else ()
    if choices:  # a test run: the models its validation run chose
        names = sorted({str(c["experiment"]) for c in choices.values() if c.get("experiment")})
        others = candidate_experiments(args.experiment, composed, names)
    return Plan(
        name,
        data_dir,
        spec,
        info,
        out,
        horizons,
        chosen,
        train_overrides,
        eval_overrides,
        ets,
        tuple(groups),
        losses,
        candidates,
        choices,
        source,
        step_candidates,
        head_candidates,
        tuple(panels),
        others if candidates or choices else {},
    )


def _loss_plan(
    args: argparse.Namespace,
    spec: CompetitionSpec,
    groups: list[Group],
    losses: tuple[str, ...],
    eval_overrides: list[str],
) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, dict] | None]:
    """`(losses, candidates, choices)`: the losses trained, those chosen among on this
    validation run, and a validation run's choices (`--adaptation-from`).

    Raises:
        ValueError: a validation run's choices that do not fit, or `--losses` beside them.
    """
    candidates = _candidates(args, spec.metric)
    if candidates and not args.validation:
        if args.adaptation_from is None:
            print(
                f"note: the loss is chosen per group on validation ({', '.join(candidates)}); "
                f"without --adaptation-from VAL_OUT this run trains {', '.join(losses)}"
            )
        candidates = ()
    elif candidates:
        losses = candidates
    choices = None
    if args.adaptation_from is not None:
        keys = [g.key for g in groups]
        choices = read_choices(args.adaptation_from, keys, _primary_metric(args, eval_overrides))
        if choices is not None and args.losses:
            raise ValueError(
                f"{args.adaptation_from} chose each group's loss on validation; leave out --losses"
            )
    return losses, candidates, choices


def _candidates(args: argparse.Namespace, metric: str) -> tuple[str, ...]:
    """The losses tried per group: `--loss-candidates` as given, or the recipe's with
    the data set's metric first (`choice.candidate_losses`); empty: none."""
    wanted = list(getattr(args, "loss_candidates", None) or [])
    if not wanted:
        return ()
    if getattr(args, "recipe_candidates", False):
        return candidate_losses(metric, wanted, REGRESSION_LOSSES)
    return tuple(dict.fromkeys(wanted))


def training_loss(metric: str) -> str:
    """The training loss for a data set scored by `metric`: the loss of that name where
    there is one (`metadist.learners.REGRESSION_LOSSES`), else smape (a note says so).
    The meta-val selection compares the loss (`selection.metric`'s default,
    `query_loss_after`), so it selects on the data set's metric too."""
    if metric in REGRESSION_LOSSES:
        return metric
    print(f"note: no training loss is {metric}: the members train on smape (--losses)")
    return "smape"


def model_takes_period(composed: dict) -> bool:
    """Whether the model of an experiment's `composed` settings has a `seasonal_period`
    option, which each group's members then get."""
    return "seasonal_period" in model_options(composed)


def _primary_metric(args: argparse.Namespace, eval_overrides: list[str]) -> str:
    """The evaluation's primary metric: the data set's, or the user's eval override."""
    return load_eval_options(args.experiment, eval_overrides).primary_metric


def _check_validation_horizons(info: SeriesInfo, horizons: list[int]) -> None:
    """Every horizon run has a series longer than it, to hold out its last values in
    the validation split (shorter series are left out of the split).

    Raises:
        ValueError: a horizon none of whose series is longer than it.
    """
    for horizon in horizons:
        labels = info.labels_of(horizon)
        if not any(info.lengths[label][1] > horizon for label in labels):
            raise ValueError(
                f"--validation: no series of horizon {horizon} ({', '.join(labels)}) has more "
                f"than {horizon} training values, so the validation split has none of them; "
                "leave that horizon out with --horizons"
            )


def _horizons(info: SeriesInfo, wanted: list[int] | None) -> list[int]:
    """The data set's horizons, or those of them `--horizons` names.

    Raises:
        ValueError: a horizon the data set does not have.
    """
    horizons = sorted(set(info.horizons.values()))
    if wanted:
        missing = sorted(set(wanted) - set(horizons))
        if missing:
            raise ValueError(f"--horizons {missing[0]}: the data set's horizons are {horizons}")
        horizons = sorted(wanted)
    return horizons


def _validation_data(
    source_dir: Path, spec: CompetitionSpec, info: SeriesInfo, out: Path
) -> tuple[Path, CompetitionSpec, SeriesInfo]:
    """The validation split of `source_dir` (written to `out/validation_data`, or
    confirmed made from the same training file), its settings and its scan.

    Raises:
        ValueError: an existing split not made from the training file as it is now.
    """
    data_dir = out / VALIDATION_DIR
    if not (data_dir / TRAIN_FILE).is_file():
        claim_output(out, source_dir / spec.train, validation=True)
    validation_split(source_dir, spec, info, data_dir, out, f"validation split of {source_dir}")
    spec = CompetitionSpec(
        **{**spec_dict(spec), "train": TRAIN_FILE, "test": TEST_FILE, "references": {}}
    )
    info = scan_series(data_dir / spec.train, spec)  # the shorter training parts
    return data_dir, spec, info


def _describe(name: str, info: SeriesInfo, spec: CompetitionSpec, validation: bool) -> None:
    print(
        f"== {name}{' (validation protocol)' if validation else ''}: {sum(info.counts.values())} series"
    )
    for label in info.counts:
        short, long = info.lengths[label]
        print(
            f"   {spec.label_col} {label}: {info.counts[label]} series, horizon "
            f"{info.horizons[label]}, period {info.periods[label]}, {short}..{long} training values"
        )


# what `members.training_overrides` sets for every training, and the flag that sets it
OWNED_KEYS = {
    "run_dir": "--out",
    "data.store": "DATA_DIR",
    "sampler.options.horizon": "--horizons",
    "sampler.options.lookback": "--lookbacks",
    "sampler.options.pad_inputs": "--lookbacks",
    "sampler.options.labels": "the data set's groups",
    "learner.options.loss": "--losses (or --loss-candidates)",
    "trainer.seed": "--seeds",
    "model.options.seasonal_period": "the data set's periods",
}


def refuse_owned_overrides(overrides: Sequence[str]) -> None:
    """Refuses an override of what the command sets for every training (it came after
    the command's own and won, unsaid: a run named H=6 trained at another horizon).

    Raises:
        ValueError: naming the key and what sets it.
    """
    for override in overrides:
        key = override.lstrip("~+").partition("=")[0]
        if key in OWNED_KEYS:
            raise ValueError(
                f"{override!r}: metadist competition sets {key} for each training, from "
                f"{OWNED_KEYS[key]}; leave it out"
            )
