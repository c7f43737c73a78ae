"""What a trained run's parts must offer to forecast and classify new data.

`metadist.eval.run.load_trained` returns a learner (a `Learner`, or a `LearnerEnsemble`
of them) and a task source whose sampler is any registered sampler; these protocols name
the parts of them that `Run` reads. A sampler's part is checked when it is used
(`metadist.tasks.inference`): a sampler without it is refused in one line naming what
it lacks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from metadist.batch import TaskSet
from metadist.learners.base import Params
from metadist.store.scaler import Scaler


class AdaptingLearner(Protocol):
    """A meta-trained learner: adapts to a support set, then predicts (a `Learner` or a
    `LearnerEnsemble`)."""

    def adapt(self, support: TaskSet, steps: int | None = None) -> Params: ...

    def predict(self, params: Params, x: torch.Tensor) -> torch.Tensor: ...

    def eval(self) -> nn.Module: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...


class WindowedSampler(Protocol):
    """A sampler of windows of store columns (what `Run.classify` reads; optionally
    `resample`, see `metadist.tasks.inference`)."""

    lookback: int
    input_columns: Sequence[int]


class ForecastingSampler(WindowedSampler, Protocol):
    """A sampler of forecast windows (`metadist.tasks.forecast.ForecastSampler`, or one of
    your own with these attributes; `stride` and `pad_inputs` are optional, 1 and 0 by
    default: see `metadist.tasks.inference`)."""

    horizon: int
    num_support: int
    target_columns: Sequence[int]


class StoreSchema(Protocol):
    """What a forecast reads of a run's store: a `SeriesStore`, or the run's record of it
    (`metadist.train.artifact.RecordedStore`) when the store is gone."""

    path: Any

    @property
    def metadata(self) -> dict[str, Any]: ...

    @property
    def column_names(self) -> list[str]: ...

    @property
    def scaler(self) -> Scaler: ...
