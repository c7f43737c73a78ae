"""The training phase's progress: meta-steps done over every training the pipeline
started, read from each running training's `metrics.jsonl`, with the time left (a bar on
a terminal, a line every few seconds elsewhere; `metadist.progress`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from metadist.progress import Progress
from metadist.train.logging import METRICS_FILE

# how much of the end of metrics.jsonl is read for its last step
_TAIL_BYTES = 4096


def last_step(run_dir: Path) -> int:
    """The last meta-step `run_dir/metrics.jsonl` records (0: none yet)."""
    path = run_dir / METRICS_FILE
    try:
        with open(path, "rb") as stream:
            size = stream.seek(0, os.SEEK_END)
            stream.seek(max(0, size - _TAIL_BYTES))
            lines = stream.read().decode(errors="replace").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by the tail, or being written
    return 0


class TrainingProgress:
    """Meta-steps done of the trainings `steps` maps (run directory -> meta-steps).

    A training that ends counts all its steps, early stopped or not, so the time left is
    an upper bound where runs stop early (`selection.patience`).
    """

    def __init__(self, display: Progress, steps: dict[Path, int]) -> None:
        self.steps = dict(steps)
        self.ended: set[Path] = set()
        total = sum(self.steps.values())
        self.counter = display.counter("meta-training", total, "meta-steps", start=self._done())

    def end(self, run_dir: Path) -> None:
        """Counts every step of the training in `run_dir` as done."""
        self.ended.add(run_dir)
        self.poll()

    def poll(self) -> None:
        """Updates the counter from the trainings' records."""
        self.counter.update(self._done())

    def _done(self) -> int:
        done = 0
        for run_dir, steps in self.steps.items():
            done += steps if run_dir in self.ended else min(last_step(run_dir), steps)
        return done
