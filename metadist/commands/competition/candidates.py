"""The ensembles one group chooses among on validation, and their names.

A validation run with candidates trains, per group, one ensemble of every candidate loss
(`--loss-candidates`) and training length: the experiment's (`--recipe cpu`: at most 600
meta-steps, stopped early on meta-val) and each shorter one of `--step-candidates` (`cpu`:
10 and 50 meta-steps; a network that barely leaves its start forecasts close to seasonal
naive, which on some sets beats any longer training). Each is named by its loss
(`smape`), with a shorter length's steps (`smape S=10`); where the ensemble spans several
lookbacks, its members of each shorter run of them from the first are candidates too
(`choice.prefix_key`: `smape S=10 L=2H+3H`). `choice.choose_group` keeps the one scoring
best by the data set's metric; `split_candidate` reads back what it was.
"""

from __future__ import annotations

from collections.abc import Sequence

from metadist.commands.competition.choice import prefix_key, split_key
from metadist.commands.competition.members import Member, members_of

_STEPS = " S="


def variant_key(loss: str, steps: int | None) -> str:
    """The name of `loss`'s ensemble trained for `steps` meta-steps (None: the
    experiment's): `smape`, `smape S=10`."""
    return loss if steps is None else f"{loss}{_STEPS}{steps}"


def split_candidate(key: str, lookbacks: Sequence[float]) -> tuple[str, int | None, list[float]]:
    """`(loss, steps, lookbacks)` of the candidate named `key` (`variant_key`, then
    `choice.prefix_key`'s lookbacks where it names them; steps None: the experiment's)."""
    variant, multiples = split_key(key, lookbacks)
    loss, _, steps = variant.rpartition(_STEPS)
    if loss and steps.isdigit():
        return loss, int(steps), multiples
    return variant, None, multiples


def candidate_members(
    members: list[Member],
    losses: Sequence[str],
    lookbacks: Sequence[float],
    horizon: int,
    steps: Sequence[int | None] = (None,),
) -> dict[str, list[Member]]:
    """The candidates one group chooses among on validation: the ensemble of each loss
    and training length (`variant_key`), and, where it spans several lookbacks, its
    members of each shorter run of lookbacks from the first (`choice.prefix_key`: 2H
    alone, 2H and 3H, ... ; shortest first)."""
    # the lookbacks (in steps) of each shorter run from the first, the same for every variant
    runs = [
        (count, {m.lookback for m in members_of(horizon, lookbacks[:count], losses[:1], 1)})
        for count in range(1, len(lookbacks))
    ]
    out = {}
    for length in steps:
        for loss in losses:
            name = variant_key(loss, length)
            own = out[name] = [m for m in members if m.loss == loss and m.steps == length]
            # a candidate is evaluated in its longest member's run: one candidate per run
            evaluated = {max((m.lookback for m in own), default=0)}
            for count, lengths in runs:
                shorter = [m for m in own if m.lookback in lengths]
                longest = max((m.lookback for m in shorter), default=0)
                if shorter and longest not in evaluated:
                    evaluated.add(longest)
                    out[prefix_key(name, lookbacks[:count])] = shorter
    return out
