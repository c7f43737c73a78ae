"""The ensemble members of each horizon: which models there are, and their meta-training,
`--jobs` processes at a time, where a member trained before is confirmed, not retrained."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metadist.commands.competition.steps import METADIST
from metadist.launch.children import OwnedChildren
from metadist.train.loop import finished_before


@dataclass(frozen=True)
class Member:
    """One meta-trained model of a horizon's ensemble."""

    horizon: int
    lookback: int
    loss: str
    seed: int

    def run_dir(self, out: Path) -> Path:
        return out / f"h{self.horizon}" / f"L{self.lookback}-{self.loss}-s{self.seed}"

    def title(self) -> str:
        return f"meta-train H={self.horizon} L={self.lookback} {self.loss} seed {self.seed}"


def members_of(
    horizon: int, lookbacks: Sequence[float], losses: Sequence[str], seeds: int
) -> list[Member]:
    """Every (lookback multiple × loss × seed) of one horizon, lookback = round(k·H) ≥ 2."""
    out = []
    for k in lookbacks:
        lookback = max(2, int(round(float(k) * horizon)))
        for loss in losses:
            for seed in range(1, seeds + 1):
                out.append(Member(horizon, lookback, loss, seed))
    return list(dict.fromkeys(out))


def training_overrides(
    member: Member, experiment: str, store: Path, out: Path, extra: Sequence[str]
) -> list[str]:
    """The `metadist train` overrides of `member`: `experiment` on `store`, with its
    horizon, lookback, loss and seed, in its run directory under `out`; then `extra`."""
    return [
        f"experiment={experiment}",
        f"data.store={store}",
        f"sampler.options.horizon={member.horizon}",
        f"sampler.options.lookback={member.lookback}",
        f"sampler.options.pad_inputs={member.lookback - 1}",
        f"learner.options.loss={member.loss}",
        f"trainer.seed={member.seed}",
        f"run_dir={member.run_dir(out)}",
        "logging.progress=false",
        *extra,
    ]


def train_members(
    ensembles: dict[int, list[Member]],
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
    return run_parallel(jobs, env, width)


def run_parallel(jobs: list[tuple[str, list[str], Path]], env: dict[str, str], width: int) -> int:
    """Runs the training jobs `width` at a time, each logging to `<run_dir>.log`; a job
    that fails is named with the last lines of its log."""
    pending = list(jobs)
    running: list[tuple[str, subprocess.Popen, Any, float]] = []
    failed: list[str] = []
    total = len(jobs)
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
        for entry in list(running):
            if entry[1].poll() is None:
                continue
            running.remove(entry)
            OwnedChildren.release(entry[1])
            failure = _finished(*entry)
            if failure is not None:
                failed.append(failure)
                if pending:  # the others would most likely fail alike: stop starting them
                    print(f"== not started: {len(pending)} training(s), after a failure")
                    pending.clear()
    for line in failed:
        print(f"failed: {line}", file=sys.stderr)
    if any("run_dir=" in line for line in failed):
        print(
            "note: in metadist competition, a run with other settings needs another --out "
            "(never run_dir=)",
            file=sys.stderr,
        )
    return 1 if failed else 0


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
