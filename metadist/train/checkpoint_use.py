"""Who reads a run's checkpoints, so that a damaged or missing one is met with the remedy
that fits the command: training resumes from them, `metadist eval` evaluates them,
`metadist forecast` and `metadist.load_run` use them. The checks are `checkpoint.py`'s,
the same for every reader; only the words of their notes and errors differ."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointUse:
    """The words a reader of checkpoints gives with a checkpoint's note or error.

    Attributes:
        verb: what the reader does with a run ("evaluate"), where it is pointed at
            another run.
        reading: what is done with the checkpoint found where `latest` is gone, in the
            note naming it ("resuming from").
        latest_damaged: the remedy for a `latest` that is no pointer while checkpoints
            exist (removed, the newest that verifies is read).
        nothing_left: the remedy for a `latest` that is no pointer, with no checkpoint
            beside it.
        none_verifies: the remedy where `latest` is gone and no checkpoint verifies.
        foreign: the remedy for a checkpoint copied in from another run.
        best_damaged: the remedy for a `best` pointer that cannot be read.
        misplaced: the remedy for a file or dangling link where the run's directory, its
            `checkpoints` or a pointer must be.
    """

    verb: str
    reading: str
    latest_damaged: str
    nothing_left: str
    none_verifies: str
    foreign: str
    best_damaged: str
    misplaced: str


TRAINING = CheckpointUse(
    verb="resume",
    reading="resuming from",
    latest_damaged="remove it to resume from the newest checkpoint that verifies, or use "
    "another run_dir",
    nothing_left="remove it or use another run_dir",
    none_verifies="move them away to start the run afresh, or use another run_dir",
    foreign="move it away, or use another run_dir",
    best_damaged="remove it or use another run_dir",
    misplaced="remove it or use another run_dir",
)


def _reader(verb: str, reading: str) -> CheckpointUse:
    """The wording for a command that reads a trained run's checkpoints to `verb` them."""
    return CheckpointUse(
        verb=verb,
        reading=reading,
        latest_damaged=f"remove it to {verb} the newest checkpoint that verifies",
        nothing_left=f"the run has no checkpoint left to {verb}: train it again",
        none_verifies=f"the run has no checkpoint left to {verb}: restore them or train it again",
        foreign=f"move it away to {verb} this run's own checkpoints",
        best_damaged=f"remove it to {verb} the latest checkpoint instead",
        misplaced="it is not a run a training wrote: give the run directory of a training",
    )


EVALUATION = _reader("evaluate", "evaluating")  # `metadist eval`
USE = _reader("use", "using")  # `metadist forecast`, `metadist.load_run`
