"""The ensemble members of each group of series: which models there are, and their
meta-training, `--jobs` processes at a time, where a member trained before is confirmed,
not retrained.

A group is the series one ensemble forecasts: a horizon's labels, or, where those labels
mix seasonal periods and the model takes one (`model.options.seasonal_period`), the
labels of one period (each such member meta-trains on its labels' series only). Each
member's model gets its group's period, and its run records the seasonal period of the
series its group forecasts (`periods.json`, by label where they differ; `api.artifact`),
so that `load_run(...).forecast` gives Theta and seasonal naive the data's period.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metadist.api.artifact import write_periods
from metadist.commands.competition.eta import TrainingProgress
from metadist.commands.competition.series import SeriesInfo
from metadist.commands.competition.steps import METADIST
from metadist.eval.competition_member import mark_member
from metadist.launch.children import OwnedChildren
from metadist.progress import Progress
from metadist.train.compose import compose_dict
from metadist.train.loop import finished_before

# seconds between two reads of the running trainings' progress
_POLL_S = 5.0


@dataclass(frozen=True)
class Group:
    """The series one ensemble forecasts.

    Attributes:
        horizon: their forecast horizon H.
        labels: their labels (all of the horizon's, or those of one period).
        period: the model's seasonal period (None: the model takes none, or the
            labels' periods differ).
        restricted: whether the members meta-train on these labels' series only (the
            horizon's labels mix periods); otherwise on every series of the data set.
        training_labels: other labels a restricted group's members meta-train on too,
            never scored (the other sets' of `--train-with`: `panels.py`).
    """

    horizon: int
    labels: tuple[str, ...]
    period: int | None = None
    restricted: bool = False
    training_labels: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """`H`, or `H-mP` for the labels of period P of a horizon that mixes periods."""
        return f"{self.horizon}-m{self.period}" if self.restricted else str(self.horizon)


def groups_of(info: SeriesInfo, horizons: Sequence[int], takes_period: bool) -> list[Group]:
    """The groups of `horizons`: one per horizon, or, for a model that takes a seasonal
    period (`takes_period`), one per period of a horizon whose labels mix periods."""
    groups = []
    for horizon in horizons:
        labels = info.labels_of(horizon)
        periods = sorted({info.periods[label] for label in labels})
        if len(periods) == 1:
            groups.append(Group(horizon, tuple(labels), periods[0] if takes_period else None))
        elif not takes_period:
            groups.append(Group(horizon, tuple(labels)))
        else:
            for period in periods:
                own = tuple(label for label in labels if info.periods[label] == period)
                groups.append(Group(horizon, own, period, restricted=True))
    return groups


@dataclass(frozen=True)
class Member:
    """One meta-trained model of a group's ensemble.

    Attributes:
        period: the model's `seasonal_period` (None: not set).
        labels: the labels it meta-trains on (empty: every series).
        steps: a shorter training: `trainer.meta_steps` of its own, a candidate a
            validation run chooses among (`candidates.py`); None: the experiment's.
        head: another start of the model's output layer (`model.options.head_init`),
            a candidate too; None: the experiment's.
        experiment: another experiment (a config of `experiments/experiment/`: its own
            model, length, ...), a candidate too; None: the run's.
        takes_period: whether its model takes the group's `period` (another
            experiment's may take none).
    """

    horizon: int
    lookback: int
    loss: str
    seed: int
    period: int | None = None
    labels: tuple[str, ...] = ()
    steps: int | None = None
    head: str | None = None
    experiment: str | None = None
    takes_period: bool = True

    def run_dir(self, out: Path) -> Path:
        group = f"h{self.horizon}" + (f"-m{self.period}" if self.labels else "")
        steps = f"-S{self.steps}" if self.steps is not None else ""
        head = f"-H{self.head}" if self.head is not None else ""
        other = f"-E{self.experiment}" if self.experiment is not None else ""
        return out / group / f"L{self.lookback}-{self.loss}-s{self.seed}{steps}{head}{other}"

    def title(self) -> str:
        period = f" m={self.period}" if self.labels else ""
        steps = f", {self.steps} meta-steps" if self.steps is not None else ""
        head = f", {self.head} head" if self.head is not None else ""
        other = f", experiment {self.experiment}" if self.experiment is not None else ""
        return (
            f"meta-train H={self.horizon}{period} L={self.lookback} {self.loss} "
            f"seed {self.seed}{steps}{head}{other}"
        )


def members_of(
    horizon: int | Group,
    lookbacks: Sequence[float],
    losses: Sequence[str],
    seeds: int,
    steps: Sequence[int | None] = (None,),
    heads: Sequence[str | None] = (None,),
    experiments: Mapping[str | None, bool] | None = None,
) -> list[Member]:
    """Every (lookback multiple × loss × seed × training length × head) of one horizon
    (or group), lookback = round(k·H) ≥ 2; `steps`: the experiment's (None) and shorter
    ones; `heads`: the experiment's output layer (None) and other starts of it.
    `experiments` (name -> whether its model takes a seasonal period; None: the run's)
    adds, for each other experiment, its (lookback × loss × seed) at the first of `steps`
    and `heads`: another experiment is a candidate at its own length and head."""
    group = horizon if isinstance(horizon, Group) else Group(horizon, ())
    labels = (*group.labels, *group.training_labels) if group.restricted else ()
    experiments = {None: True} if experiments is None else experiments
    out = []
    for (other, head, length), k in itertools.product(
        variants(steps, heads, experiments), lookbacks
    ):
        lookback = max(2, int(round(float(k) * group.horizon)))
        for loss in losses:
            for seed in range(1, seeds + 1):
                member = Member(group.horizon, lookback, loss, seed, group.period, labels)
                out.append(dataclasses.replace(member, steps=length, head=head, experiment=other,
                                               takes_period=experiments[other]))  # fmt: skip
    return list(dict.fromkeys(out))


def variants(
    steps: Sequence[int | None], heads: Sequence[str | None], experiments: Iterable[str | None]
) -> list[tuple[str | None, str | None, int | None]]:
    """The (experiment, head, training length) of each ensemble a group trains: the run's
    experiment (None, where among `experiments`) at every head × length, each other
    experiment at the first of both (its own length and head), in that order."""
    experiments = list(experiments)
    own = [(None, h, n) for h in heads for n in steps] if None in experiments else []
    return own + [(other, heads[0], steps[0]) for other in experiments if other is not None]


def training_overrides(
    member: Member, experiment: str, store: Path, out: Path, extra: Sequence[str]
) -> list[str]:
    """The `metadist train` overrides of `member`: `experiment` on `store`, with its
    horizon, lookback, loss, seed, seasonal period (where its model takes one) and labels,
    in its run directory under `out` (`experiment`, or a candidate's own); then
    `extra`, then a candidate's own head (`model.options.head_init`) and length
    (`trainer.meta_steps`)."""
    overrides = [
        f"experiment={member.experiment or experiment}",
        f"data.store={store}",
        f"sampler.options.horizon={member.horizon}",
        f"sampler.options.lookback={member.lookback}",
        f"sampler.options.pad_inputs={member.lookback - 1}",
        f"learner.options.loss={member.loss}",
        f"trainer.seed={member.seed}",
        f"run_dir={member.run_dir(out)}",
        "logging.progress=false",
    ]
    if member.period is not None and member.takes_period:
        overrides.append(f"model.options.seasonal_period={member.period}")
    if member.labels:
        overrides.append(f"sampler.options.labels={json.dumps(list(member.labels))}")
    # a candidate's own head and length come last: they are what the member is
    own = [] if member.head is None else [f"model.options.head_init={member.head}"]
    own += [] if member.steps is None else [f"trainer.meta_steps={member.steps}"]
    return [*overrides, *extra, *own]


def series_periods(periods: dict[str, int], labels: Sequence[str]) -> int | dict[str, int]:
    """The seasonal period of the series of `labels`, by label (of `periods`), so that a
    forecast of a series of another label is refused rather than given this group's
    period; where `labels` is empty (every series), one integer where they share one,
    else by label."""
    if labels:
        return {k: v for k, v in sorted(periods.items()) if k in labels}
    values = sorted(set(periods.values()))
    return values[0] if len(values) == 1 else dict(sorted(periods.items()))


def record_periods(
    groups: Sequence[Group],
    ensembles: dict[str, list[Member]],
    out: Path,
    periods: dict[str, int],
) -> None:
    """Records in every member's run the seasonal period of the series its group
    forecasts (`periods`: every label's), for `load_run(...).forecast` (`api.artifact`),
    and that it is a member of the competition output `out` (`mark_member`: a copy
    elsewhere still cuts short histories as the protocol does)."""
    for group in groups:
        for member in ensembles[group.key]:
            write_periods(member.run_dir(out), series_periods(periods, group.labels))
            mark_member(member.run_dir(out), out)


def train_members(
    ensembles: dict[str, list[Member]],
    experiment: str,
    store: Path,
    out: Path,
    extra: Sequence[str],
    env: dict[str, str],
    width: int,
) -> int:
    """Meta-trains every member of `ensembles` not trained before (`finished_before`,
    confirmed in this process), `width` at a time; 1 where a training failed, else 0."""
    jobs = []
    steps: dict[Path, int] = {}
    for members in ensembles.values():
        for member in members:
            run_dir = member.run_dir(out)
            overrides = training_overrides(member, experiment, store, out, extra)
            began = time.perf_counter()
            if finished_before(overrides, run_dir):
                seconds = time.perf_counter() - began
                print(
                    f"== {member.title()}: confirmed, trained before ({seconds:.1f} s)", flush=True
                )
            else:
                jobs.append(
                    (member.title(), [*METADIST, "train", "--no-eval", *overrides], run_dir)
                )
                steps[run_dir] = meta_steps(overrides)
    return run_parallel(jobs, env, width, steps)


def meta_steps(overrides: list[str]) -> int:
    """`trainer.meta_steps` of the training `overrides` describe (0 where they do not
    compose: the training itself then says what is wrong)."""
    try:
        return int(compose_dict(overrides)["trainer"]["meta_steps"])
    except (ValueError, KeyError, TypeError, FileNotFoundError):
        return 0


def run_parallel(
    jobs: list[tuple[str, list[str], Path]],
    env: dict[str, str],
    width: int,
    steps: dict[Path, int] | None = None,
) -> int:
    """Runs the training jobs `width` at a time, each logging to `<run_dir>.log`; a job
    that fails is named with the last lines of its log. With `steps` (run directory ->
    meta-steps), the meta-steps done over all jobs are shown with the time left."""
    with Progress() as display:
        tracker = TrainingProgress(display, steps) if steps else None
        failed = _run_jobs(jobs, env, width, tracker)
    for line in failed:
        print(f"failed: {line}", file=sys.stderr)
    if any("run_dir=" in line for line in failed):
        print(
            "note: in metadist competition, a run with other settings needs another --out "
            "(never run_dir=)",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _run_jobs(
    jobs: list[tuple[str, list[str], Path]],
    env: dict[str, str],
    width: int,
    tracker: TrainingProgress | None,
) -> list[str]:
    """The loop of `run_parallel`; the failures' lines."""
    pending = list(jobs)
    running: list[tuple[str, subprocess.Popen, Any, float]] = []
    failed: list[str] = []
    total = len(jobs)
    run_dirs = {title: run_dir for title, _, run_dir in jobs}
    polled = time.perf_counter()
    while pending or running:
        while pending and len(running) < width:
            title, command, run_dir = pending.pop(0)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log = open(run_dir.with_suffix(".log"), "w")  # noqa: SIM115 (closed below)
            print(f"== [{total - len(pending)}/{total}] {title} (log: {log.name})", flush=True)
            process = OwnedChildren.popen_owned(
                command, env=env, stdout=log, stderr=subprocess.STDOUT
            )
            running.append((title, process, log, time.perf_counter()))
        time.sleep(0.5)
        if tracker is not None and time.perf_counter() - polled >= _POLL_S:
            tracker.poll()
            polled = time.perf_counter()
        for entry in list(running):
            if entry[1].poll() is None:
                continue
            running.remove(entry)
            OwnedChildren.release(entry[1])
            if tracker is not None:
                tracker.end(run_dirs[entry[0]])
            failure = _finished(*entry)
            if failure is not None:
                failed.append(failure)
                if pending:  # the others would most likely fail alike: stop starting them
                    print(f"== not started: {len(pending)} training(s), after a failure")
                    pending.clear()
    return failed


def _finished(title: str, process: subprocess.Popen, log: Any, began: float) -> str | None:
    """Closes the log of a job that ended and says how it went; the failure's line
    (title, log and its last lines) where it failed, else None."""
    log.close()
    # a run that had all its steps already says so in its log: nothing was trained
    seconds = time.perf_counter() - began
    log_text = Path(log.name).read_text(errors="replace")
    if process.returncode == 0 and "nothing to train" in log_text:
        print(f"== {title}: confirmed, trained before ({seconds:.1f} s)", flush=True)
    else:
        print(f"== {title}: {seconds:.1f} s (exit status {process.returncode})", flush=True)
    if process.returncode != 0:
        tail = log_text.strip().splitlines()[-3:]
        return f"{title} (see {log.name}): " + " / ".join(tail)
    return None
