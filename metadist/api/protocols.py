"""What a trained run's parts must offer to forecast and classify new data.

`metadist.eval.run.load_trained` returns a learner (a `Learner`, or a `LearnerEnsemble`
of them) and a task source whose sampler is any registered sampler; these protocols name
the parts of them that `Run` reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import torch
from torch import nn

from metadist.batch import TaskSet
from metadist.learners.base import Params


class AdaptingLearner(Protocol):
    """A meta-trained learner: adapts to a support set, then predicts (a `Learner` or a
    `LearnerEnsemble`)."""

    def adapt(self, support: TaskSet, steps: int | None = None) -> Params: ...

    def predict(self, params: Params, x: torch.Tensor) -> torch.Tensor: ...

    def eval(self) -> nn.Module: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...


class WindowedSampler(Protocol):
    """A sampler of windows of store columns (what `Run.classify` reads)."""

    lookback: int
    input_columns: Sequence[int]


class ForecastingSampler(WindowedSampler, Protocol):
    """A sampler of forecast windows (`metadist.tasks.forecast.ForecastSampler`)."""

    horizon: int
    num_support: int
    stride: int
    pad_inputs: int
    target_columns: Sequence[int]
