"""The pipeline driver: the protocol's steps in order (the plan and its checks in
`plan.py`, then ingest, training, evaluation, the pooled table), each confirmed rather
than redone where it can be."""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

from metadist.commands.competition.adaptation import write_adaptation_choice
from metadist.commands.competition.candidates import candidate_members, choose, variant_size
from metadist.commands.competition.choice import describe, write_choices
from metadist.commands.competition.evaluation import evaluate_candidates
from metadist.commands.competition.guard import write_guarded
from metadist.commands.competition.members import Member, members_of, record_periods, train_members
from metadist.commands.competition.output import claim_output
from metadist.commands.competition.panels import ingest_training, record_train_with, training_file
from metadist.commands.competition.plan import Plan, plan_run
from metadist.commands.competition.reuse import forget_evaluations
from metadist.commands.competition.spec import ADAPTATION_FILE
from metadist.commands.competition.table import pooled_table, table_title
from metadist.eval.plausibility import GUARD_FILE, write_guard


def run_pipeline(args: argparse.Namespace, prog: str) -> int:
    """Runs the whole protocol `args` describe; 1 where a step failed, else 0.

    Raises:
        ValueError, FileNotFoundError: the data, settings or outputs do not fit.
    """
    started = time.perf_counter()
    plan = plan_run(args)
    claim_output(plan.out, plan.source, args.validation)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("WANDB_MODE", "disabled")
    store = plan.out / "store"
    own = plan.data_dir / plan.spec.train
    train = training_file(own, plan.spec, plan.panels, plan.out, args.validation)
    record_train_with(plan.out, plan.panels)
    if ingest_training(plan.spec, train, store, plan.out, env) != 0:
        return 1
    ensembles = {
        g.key: members_of(
            g,
            plan.lookbacks_of(g.key, args.lookbacks),
            plan.losses_of(g.key),
            args.seeds,
            plan.steps_of(g.key),
            plan.heads_of(g.key),
            plan.experiments_of(g.key),
        )
        for g in plan.groups
    }
    trained = train_members(
        ensembles, args.experiment, store, plan.out, plan.train_overrides, env, args.jobs
    )
    if trained != 0:
        return 1
    record_periods(plan.groups, ensembles, plan.out, plan.info.periods)
    if args.evaluate_again:
        forget_evaluations(plan.out)
    firsts, chosen = [], {}
    for number, group in enumerate(plan.groups, 1):
        print(f"== evaluation {number}/{len(plan.groups)}", flush=True)
        # the group's labels alone: each horizon's evaluation scores its labels
        info = dataclasses.replace(plan.info, horizons={k: group.horizon for k in group.labels})
        members = ensembles[group.key]
        by_loss = {"": members}
        if plan.candidates:
            by_loss = candidate_members(
                members, plan.candidates, args.lookbacks, group.horizon,
                plan.steps_of(group.key), plan.heads_of(group.key), list(plan.experiments_of(group.key)),
            )  # fmt: skip
        evaluated = evaluate_candidates(
            group.horizon, by_loss, plan.out, plan.spec, info, plan.test_path, plan.ets,
            plan.eval_overrides,
        )  # fmt: skip
        if plan.candidates:
            run, chosen[group.key] = choose(evaluated, args.lookbacks, args.experiment_margin)
            firsts.append(run)
        else:
            firsts.append(evaluated[""])
    if chosen:
        write_choices(plan.out, chosen, validation=True)
    _report(plan, args, ensembles, firsts)
    for key, entry in chosen.items():
        print(describe(key, entry))
    if plan.choices and plan.chosen:
        write_choices(plan.out, plan.choices, False, args.adaptation_from)
        runs = [(f, plan.chosen[g.key], float(plan.choices[g.key]["weight"]))
                for f, g in zip(firsts, plan.groups, strict=True)]  # fmt: skip
        weights = {g.key: float(plan.choices[g.key]["weight"]) for g in plan.groups}
        print(write_guarded(plan.out, runs, plan.spec.metric, weights), end="")
    print(f"== all steps: {time.perf_counter() - started:.1f} s; table: {plan.out / 'metrics.md'}")
    return 0


def _report(
    plan: Plan, args: argparse.Namespace, ensembles: dict[str, list[Member]], firsts: list[Path]
) -> None:
    """Writes each group's adaptation choice and the pooled table, and prints both; each
    group's evaluated run records the model the table reports (`guard.json`, which
    `write_guarded` completes with the band where validation chose one), else none."""
    keys, chosen = [g.key for g in plan.groups], plan.chosen
    for key, first in zip(keys, firsts, strict=True):
        if chosen is None:
            (first / GUARD_FILE).unlink(missing_ok=True)  # an earlier run's choice
        else:
            source = str(args.adaptation_from / ADAPTATION_FILE)
            write_guard(first, None, source, model=chosen[key])
    decisions = write_adaptation_choice(
        plan.out, dict(zip(keys, firsts, strict=True)), args.validation
    )
    title = table_title(
        args.experiment,
        plan.name,
        args.validation,
        variant_size(ensembles[keys[0]]),
        chosen is not None,
        tuple(plan.candidates or ()),
    )
    picks = None if chosen is None else [chosen[k] for k in keys]
    table = pooled_table(firsts, plan.out, title, picks)
    print(table.read_text(), end="")
    for key, entry in decisions.items():
        print(
            f"== H={key}: adapted {entry['adapted']:.3f}, unadapted {entry['unadapted']:.3f} "
            f"{entry['metric']}: {entry['choice']} wins"
            + (f"; reported as the model: {chosen[key]} (validation)" if chosen else "")
        )
