"""Model selection on meta-val, and early stopping.

With meta-val evaluation on (`trainer.eval_every > 0`), every evaluation is compared
with the best one so far by one metric (`selection.metric`): an improvement writes a
checkpoint of that step and moves `checkpoints/best` to it (`metadist.train.checkpoint`),
which evaluation then loads; `selection.patience` evaluations in a row without one stop
the run (early stopping). `Selection` is the running record; it is saved in every
checkpoint, so that a resumed run counts on exactly where the stopped one was.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metadist.options import check_min
from metadist.train.checkpoint import best_name, checkpoint_dir, write_best

_MODES = ("min", "max")
# the meta-val metrics the built-in learners log (`loss`: the meta-objective)
VAL_METRICS = (
    "loss",
    "query_loss_after",
    "query_loss_before",
    "support_loss_before",
    "query_accuracy_after",
    "query_accuracy_before",
    "reptile_distance",
)


@dataclass
class SelectionConfig:
    """Which checkpoint a run keeps as its best, and when it stops early.

    Attributes:
        metric: the meta-val metric compared (a key of the `val` records of
            `metrics.jsonl`); `None`: `query_accuracy_after` for a learner whose loss is
            `cross_entropy` (classification), else `query_loss_after`.
        mode: `max` or `min`, whether a larger value is better; `None`: `max` for a
            metric whose name holds "accuracy", else `min`.
        patience: stop once this many meta-val evaluations in a row did not improve on
            the best (writing a final checkpoint); `None`: never stop early. Without
            meta-val evaluation (`trainer.eval_every=0`, or no meta-val share in
            `data.fractions`) nothing is selected and it does not apply (a note says so).
        min_delta: how much better than the best a value must be to count as an
            improvement.
    """

    metric: str | None = None
    mode: str | None = None
    patience: int | None = None
    min_delta: float = 0.0

    def validate(self) -> None:
        """Raises `ValueError` naming the first bad field."""
        if self.metric is not None and (not isinstance(self.metric, str) or not self.metric):
            raise ValueError(f"selection.metric must be a metric name or null, got {self.metric!r}")
        if self.mode is not None and self.mode not in _MODES:
            raise ValueError(f"selection.mode must be min, max or null, got {self.mode!r}")
        if self.patience is not None:
            check_min("selection.patience", self.patience, 1)
        if not self.min_delta >= 0:
            raise ValueError(f"selection.min_delta must be >= 0, got {self.min_delta}")

    def resolved_metric(self, loss: str) -> str:
        """`metric`, or the default for a learner whose loss is `loss`."""
        if self.metric is not None:
            return self.metric
        return "query_accuracy_after" if loss == "cross_entropy" else "query_loss_after"

    def resolved_mode(self, metric: str) -> str:
        """`mode`, or the default for `metric`."""
        if self.mode is not None:
            return self.mode
        return "max" if "accuracy" in metric else "min"


class Selection:
    """The best meta-val evaluation so far, and how many since did not improve on it.

    Args:
        config: the `selection` section.
        loss: the learner's loss (`cross_entropy` selects on accuracy by default).
        val_tasks: how many meta-val tasks each evaluation scores (all ranks together):
            values over another number of tasks (a run resumed with another
            `trainer.eval_batches` or `trainer.meta_batch_size`) are not compared with
            this run's. `None`: not known, not checked.
    """

    def __init__(self, config: SelectionConfig, loss: str, val_tasks: int | None = None) -> None:
        self.metric = config.resolved_metric(loss)
        self.mode = config.resolved_mode(self.metric)
        self.val_tasks = val_tasks
        self.patience = config.patience
        self.min_delta = float(config.min_delta)
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.best_checkpoint: str | None = None
        self.bad_evals = 0

    def update(self, step: int, values: dict[str, float], checkpoint: str) -> bool:
        """Counts the evaluation of `step`, whose checkpoint is named `checkpoint`;
        whether it is the new best (its checkpoint must then be written).

        Raises:
            ValueError: the evaluation has no `metric` (naming those it has).
        """
        if self.metric not in values:
            raise ValueError(
                f"selection.metric={self.metric!r} is not among the meta-val metrics of "
                f"this learner ({', '.join(sorted(values))}); choose one of them"
            )
        value = float(values[self.metric])
        if self.best_value is None:
            better = math.isfinite(value)
        elif self.mode == "max":
            better = value > self.best_value + self.min_delta
        else:
            better = value < self.best_value - self.min_delta
        if better:
            self.best_value, self.best_step, self.bad_evals = value, step, 0
            self.best_checkpoint = checkpoint
        else:
            self.bad_evals += 1
        return better

    @property
    def exhausted(self) -> bool:
        """Whether `patience` evaluations in a row did not improve: the run stops."""
        return self.patience is not None and self.bad_evals >= self.patience

    def record(self) -> dict[str, Any]:
        """What `checkpoints/best` and `best.json` record besides the checkpoint."""
        return _record(self.metric, self.mode, self.best_value)

    def state(self) -> dict[str, Any]:
        """The record, for a checkpoint."""
        return {
            "metric": self.metric,
            "mode": self.mode,
            "best_value": self.best_value,
            "best_step": self.best_step,
            "best_checkpoint": self.best_checkpoint,
            "bad_evals": self.bad_evals,
            "val_tasks": self.val_tasks,
        }

    def restore(self, state: dict[str, Any] | None) -> str | None:
        """Continues the record of a checkpoint; a note when it cannot (another metric or
        mode than the checkpoint's, or values over another number of meta-val tasks: the
        record starts afresh), else `None`."""
        if not state:
            return None
        if (state.get("metric"), state.get("mode")) != (self.metric, self.mode):
            return (
                f"note: the run selected on {state.get('mode')} val {state.get('metric')}, "
                f"this command on {self.mode} val {self.metric}: the best so far is forgotten"
            )
        saved_tasks = state.get("val_tasks")
        if None not in (saved_tasks, self.val_tasks) and saved_tasks != self.val_tasks:
            return (
                f"note: the run selected on val {self.metric} over {saved_tasks} meta-val "
                f"tasks, this command evaluates {self.val_tasks} (trainer.eval_batches or "
                "trainer.meta_batch_size changed): its values are not comparable, so the "
                "best so far is forgotten"
            )
        value = state.get("best_value")
        self.best_value = None if value is None else float(value)
        step = state.get("best_step")
        self.best_step = None if step is None else int(step)
        name = state.get("best_checkpoint")
        self.best_checkpoint = None if name is None else str(name)
        self.bad_evals = int(state.get("bad_evals", 0))
        return None

    def stop_message(self, step: int) -> str:
        """The line saying why the run stopped (or stays stopped) at `step`."""
        best = "no evaluation had a finite value"
        if self.best_value is not None:
            best = (
                f"the best, {self.best_value:.6g} at step {self.best_step}, is checkpoints/best "
                f"({self.best_checkpoint})"
            )
        return (
            f"early stop at step {step}: val {self.metric} has not improved for "
            f"{self.bad_evals} evaluations (selection.patience={self.patience}); {best}"
        )


def check_val_metric(flag: str, name: str | None, learner: str, loss: str | None = None) -> None:
    """Refuses a meta-val metric `name` (given as `flag`) of a built-in learner (its
    registered name `learner`, with the loss `loss` where known) that it does not log,
    before any training: a near miss of one the built-in learners log (`VAL_METRICS`),
    or an accuracy of a learner whose loss is not cross-entropy. Either is otherwise
    found at the first meta-val. A name far from all of them passes, and any name of a
    learner of the user's own (which may log others).

    Raises:
        ValueError: naming the close built-in name, or the loss.
    """
    if name is None or not _built_in(learner):
        return
    said = f"{flag}{' ' if flag.startswith('--') else '='}{name}"
    if "accuracy" in name and loss is not None and loss != "cross_entropy":
        raise ValueError(
            f"{said}: learner {learner} with loss {loss} logs no accuracy (only a "
            "cross_entropy learner does); choose a loss metric such as query_loss_after"
        )
    if name in VAL_METRICS:
        return
    close = difflib.get_close_matches(name, VAL_METRICS, n=1, cutoff=0.8)
    if close:
        raise ValueError(
            f"{said}: no built-in learner logs it; did you mean {close[0]}? "
            f"(meta-val metrics: {', '.join(VAL_METRICS)})"
        )


def _built_in(learner: str) -> bool:
    """Whether `learner` names a learner of this package (not one a user registered)."""
    from metadist.learners.registry import LEARNERS

    return learner in LEARNERS and LEARNERS.get(learner).__module__.startswith("metadist.learners.")


def _record(metric: str, mode: str, value: float | None) -> dict[str, Any]:
    return {"split": "val", "metric": metric, "mode": mode, "value": value}


def stopped_early(config: SelectionConfig, loss: str, state: dict[str, Any] | None) -> bool:
    """Whether a checkpoint's selection record (`state`) has used up `config.patience`
    (of a learner whose loss is `loss`), counted on the same metric and mode: a run
    resumed with a larger patience, or none, goes on, as `train` would."""
    selection = Selection(config, loss)
    return bool(state) and selection.restore(state) is None and selection.exhausted


def describe_checkpoint(path: Path, pointer: dict[str, Any]) -> str:
    """A checkpoint's name and, for a run's best (`checkpoints/best`), what selected it,
    e.g. "step_00000120.pt (best by val query_accuracy_after = 0.71)"."""
    value = pointer.get("value")
    if pointer.get("metric") is None or not isinstance(value, (int, float)):
        return path.name
    return f"{path.name} (best by {pointer.get('split', 'val')} {pointer['metric']} = {value:.4g})"


def restore_best(run_dir: str | os.PathLike, state: dict[str, Any] | None) -> bool:
    """Points `checkpoints/best` at the best checkpoint a resumed checkpoint's selection
    record (`state`) names, where it points elsewhere: a run stopped between moving
    `latest` and `best` (or resumed from an older checkpoint than `latest`, whose best
    was earlier). Nothing where the record has no best or its file is gone.

    Returns:
        Whether `best` moved.
    """
    name = (state or {}).get("best_checkpoint")
    directory = checkpoint_dir(run_dir)
    if not isinstance(name, str) or not (directory / name).is_file():
        return False
    if best_name(directory) == name:
        return False
    data = (directory / name).read_bytes()
    assert state is not None  # it names a checkpoint
    pointer = {
        "checkpoint": name,
        "step": int(state["best_step"]),
        "num_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        **_record(state["metric"], state["mode"], state["best_value"]),
    }
    write_best(directory, pointer)
    return True
