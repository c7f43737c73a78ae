"""The ensembles one group chooses among on validation, and their names.

A validation run with candidates trains, per group, one ensemble of every candidate loss
(`--loss-candidates`), training length and start of the output layer: the experiment's
length (`--recipe cpu`: at most 600 meta-steps, stopped early on meta-val) and each
shorter one of `--step-candidates` (`cpu`: 10 and 50 meta-steps; a network that barely
leaves its start forecasts close to seasonal naive, which on some sets beats any longer
training); the experiment's head and each other `model.options.head_init` of
`--head-candidates` (`cpu`: zero, with which the untrained seasonal forecaster is
seasonal naive exactly); and the run's experiment and each other experiment of
`--experiment-candidates` (`cpu`: `competition_cpu_mlp`, the same MLP normalised by each
window's last value and scale, which learns seasonality from the data rather than from
each window's decomposition, trained longer), another experiment at its own length and
head only. Each is named by its loss (`smape`), with a shorter length's steps, another
head and another experiment where it has them (`smape S=10 head=zero`,
`smape experiment=competition_cpu_mlp`); where the ensemble
spans several lookbacks, its members of each shorter run of them from the first are
candidates too (`choice.prefix_key`: `smape S=10 L=2H+3H`). `choice.choose_group` keeps
the one scoring best by the data set's metric (another experiment only by a clear margin,
`switch.py`); `split_candidate` reads back what it was.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from metadist.commands.competition.choice import choose_group, prefix_key, split_key
from metadist.commands.competition.members import Member, members_of, variants
from metadist.train.compose import compose_dict

_STEPS = "S="
_HEAD = "head="
_EXPERIMENT = "experiment="


class Candidate(NamedTuple):
    """What a candidate's name says: its loss, training length, head and experiment
    (None: the run's) and the lookback multiples of its members."""

    loss: str
    steps: int | None
    head: str | None
    lookbacks: list[float]
    experiment: str | None = None


def variant_key(
    loss: str, steps: int | None, head: str | None = None, experiment: str | None = None
) -> str:
    """The name of `loss`'s ensemble trained for `steps` meta-steps with the output
    layer started as `head`, of the experiment `experiment` (None: the run's): `smape`,
    `smape S=10`, `smape S=10 head=zero`, `smape experiment=competition_cpu_mlp`."""
    parts = [loss]
    parts += [] if steps is None else [f"{_STEPS}{steps}"]
    parts += [] if head is None else [f"{_HEAD}{head}"]
    parts += [] if experiment is None else [f"{_EXPERIMENT}{experiment}"]
    return " ".join(parts)


def split_candidate(key: str, lookbacks: Sequence[float]) -> Candidate:
    """What the candidate named `key` is (`variant_key`, then `choice.prefix_key`'s
    lookbacks where it names them)."""
    variant, multiples = split_key(key, lookbacks)
    loss, *parts = variant.split(" ")
    steps, head, other = None, None, None
    for part in parts:
        if part.startswith(_STEPS) and part[len(_STEPS) :].isdigit():
            steps = int(part[len(_STEPS) :])
        elif part.startswith(_HEAD) and part[len(_HEAD) :]:
            head = part[len(_HEAD) :]
        elif part.startswith(_EXPERIMENT) and part[len(_EXPERIMENT) :]:
            other = part[len(_EXPERIMENT) :]
        else:  # not a name of `variant_key`'s: the loss's ensemble as a whole
            return Candidate(variant, None, None, multiples)
    return Candidate(loss, steps, head, multiples, other)


def candidate_members(
    members: list[Member],
    losses: Sequence[str],
    lookbacks: Sequence[float],
    horizon: int,
    steps: Sequence[int | None] = (None,),
    heads: Sequence[str | None] = (None,),
    experiments: Sequence[str | None] = (None,),
) -> dict[str, list[Member]]:
    """The candidates one group chooses among on validation: the ensemble of each loss,
    training length, head and experiment (`variant_key`; another experiment at the first
    length and head only, as `members.members_of` trains it), and, where it spans several
    lookbacks, its members of each shorter run of lookbacks from the first
    (`choice.prefix_key`: 2H alone, 2H and 3H, ... ; shortest first)."""
    # the lookbacks (in steps) of each shorter run from the first, the same for every variant
    runs = [
        (count, {m.lookback for m in members_of(horizon, lookbacks[:count], losses[:1], 1)})
        for count in range(1, len(lookbacks))
    ]
    out = {}
    for other, head, length in variants(steps, heads, experiments):
        for loss in losses:
            name = variant_key(loss, length, head, other)
            own = out[name] = [
                m
                for m in members
                if (m.loss, m.steps, m.head, m.experiment) == (loss, length, head, other)
            ]
            # a candidate is evaluated in its longest member's run: one candidate per run
            evaluated = {max((m.lookback for m in own), default=0)}
            for count, lengths in runs:
                shorter = [m for m in own if m.lookback in lengths]
                longest = max((m.lookback for m in shorter), default=0)
                if shorter and longest not in evaluated:
                    evaluated.add(longest)
                    out[prefix_key(name, lookbacks[:count])] = shorter
    return out


def choose(
    evaluated: dict[str, Path], lookbacks: Sequence[float], margin: float
) -> tuple[Path, dict[str, Any]]:
    """One group's choice among its candidates' `evaluated` runs (`choice.choose_group`;
    another experiment's only by more than `margin` standard errors, `switch.py`), with
    what its candidate is (`loss`, `steps`, `head`, `lookbacks`, `experiment`), and the
    chosen candidate's evaluated run."""
    others = {k for k in evaluated if split_candidate(k, lookbacks).experiment is not None}
    entry = choose_group(evaluated, others, margin)
    run = evaluated[entry["loss"]]
    candidate = split_candidate(entry["loss"], lookbacks)
    entry["loss"], entry["steps"] = candidate.loss, candidate.steps
    entry["head"], entry["lookbacks"] = candidate.head, candidate.lookbacks
    entry["experiment"] = candidate.experiment
    return run, entry


def variant_size(members: Sequence[Member]) -> int:
    """How many of `members` share the first one's training length, head and experiment:
    one candidate's ensemble for each loss (every member where there are no candidates)."""
    first = members[0]
    own = (first.steps, first.head, first.experiment)
    return sum((m.steps, m.head, m.experiment) == own for m in members)


def model_options(composed: dict) -> dict:
    """`model.options` of an experiment's `composed` settings (`compose_dict`)."""
    return (composed.get("model") or {}).get("options") or {}


def candidate_lengths(args: argparse.Namespace, composed: dict) -> tuple[int, ...]:
    """The shorter trainings tried per group (`--step-candidates`), ascending: those
    shorter than the experiment's `trainer.meta_steps` (of its `composed` settings; a
    note names any left out)."""
    wanted = sorted(set(getattr(args, "step_candidates", None) or ()))
    full = (composed.get("trainer") or {}).get("meta_steps")
    full = full if isinstance(full, int) else 0  # 0: the training will say why
    kept = tuple(n for n in wanted if n < full or not full)
    if len(kept) < len(wanted):
        dropped = ", ".join(str(n) for n in wanted if n not in kept)
        print(
            f"note: --step-candidates {dropped}: not shorter than the experiment's {full} "
            "meta-steps, left out"
        )
    return kept


def candidate_heads(args: argparse.Namespace, composed: dict) -> tuple[str, ...]:
    """The other starts of the output layer tried per group (`--head-candidates`), in
    the order given: those the model of the experiment's `composed` settings does not
    start with already (a note names any left out).

    Raises:
        ValueError: `--head-candidates` given for a model without a `head_init` option
            (the recipe's own candidates are left out then, with a note).
    """
    wanted = list(dict.fromkeys(getattr(args, "head_candidates", None) or ()))
    options = model_options(composed)
    if wanted and "head_init" not in options:
        problem = (
            f"--head-candidates {' '.join(wanted)}: the model of experiment={args.experiment} "
            "has no head_init option (the forecaster has one)"
        )
        if getattr(args, "head_candidates_from_recipe", False):  # not asked for: dropped
            print(f"note: {problem}; the recipe's head candidates are left out")
            return ()
        raise ValueError(f"{problem}; leave --head-candidates out")
    kept = tuple(head for head in wanted if head != options.get("head_init"))
    if len(kept) < len(wanted):
        print(
            f"note: --head-candidates {options['head_init']}: the experiment's own head, left out"
        )
    return kept


def candidate_experiments(
    experiment: str,
    composed: dict,
    names: Sequence[str],
    overrides: Sequence[str] = (),
    from_recipe: bool = False,
) -> dict[str, bool]:
    """The other experiments of `names` (`--experiment-candidates`, or those a validation
    run chose; configs of `experiments/experiment/`), in order, each with whether its
    model takes a seasonal period (`model.options.seasonal_period`): those other than
    `experiment` (a note names it where given). The user's `overrides` apply to every
    member, so the recipe's own candidates (`from_recipe`) are left out, with a note,
    where one would not take them: another model (`model=...`) or a model option its
    model does not have (`model.options.clamp` beside a model without a clamp).

    Raises:
        ValueError: a name that is no experiment config, or one whose model takes a
            seasonal period where the model of `experiment` (its `composed` settings)
            takes none (its groups have no period to give).
    """
    kept: dict[str, bool] = {}
    for name in dict.fromkeys(names):
        if name == experiment:
            print(f"note: --experiment-candidates {name}: the run's own experiment, left out")
            continue
        try:
            options = model_options(compose_dict([f"experiment={name}"]))
        except (ValueError, FileNotFoundError):
            raise ValueError(
                f"--experiment-candidates {name}: no such experiment config "
                "(experiments/experiment/)"
            ) from None
        foreign = [o for o in overrides if not _takes(options, o)] if from_recipe else []
        if foreign:
            print(
                f"note: the recipe's other experiment {name} is left out: its model does "
                f"not take {foreign[0]} (give --experiment-candidates {name} to try it anyway)"
            )
            continue
        takes_period = "seasonal_period" in options
        if takes_period and "seasonal_period" not in model_options(composed):
            raise ValueError(
                f"--experiment-candidates {name}: its model takes a seasonal period, the "
                f"model of experiment={experiment} does not, so its groups have none to "
                "give; run it as the experiment instead"
            )
        kept[name] = takes_period
    return kept


def _takes(options: dict, override: str) -> bool:
    """Whether a model of `options` takes the training `override`: anything but another
    model (`model=...`) or one of its options it does not have."""
    key = override.lstrip("+~").split("=")[0]
    if key == "model":
        return False
    return not key.startswith("model.options.") or key.split(".")[2] in options
