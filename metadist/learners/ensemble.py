"""Several trained learners forecasting as one (an ensemble, for evaluation).

Each member adapts to the task on its own and predicts; the ensemble's prediction is the
element-wise mean or median of the members' predictions. Ensembles of independently
trained networks are the usual way to take the variance of one training run out of a
forecast; `metadist eval run_dir=A eval.ensemble=[B,C]` builds one from runs.
Forecasting members may look back over fewer rows than the windows hold (an ensemble over
lookbacks): each then sees the most recent rows of every window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from metadist.batch import TaskSet, check_support
from metadist.learners.base import Params

REDUCTIONS = ("mean", "median")


class LearnerEnsemble(nn.Module):
    """Adapts and predicts with every member learner; reduces their predictions.

    Args:
        learners: trained learners of the same loss, taking the same inputs and
            predicting the same shapes.
        reduce: "mean" or "median" of the members' predictions.
        lookbacks: for windowed inputs `[..., L, F]`, how many of the most recent rows
            each member takes (`None` for all of them); `None` gives every member the
            whole input.

    Raises:
        ValueError: fewer than two learners, differing losses, an unknown reduction, or
            lookbacks not matching the members.
    """

    def __init__(
        self,
        learners: Sequence[nn.Module],
        reduce: str = "mean",
        lookbacks: Sequence[int | None] | None = None,
    ) -> None:
        super().__init__()
        if len(learners) < 2:
            raise ValueError(f"an ensemble needs at least two learners, got {len(learners)}")
        losses = {getattr(learner, "loss", None) for learner in learners}
        if len(losses) != 1:
            raise ValueError(
                f"ensemble members must share one loss, got {sorted(map(str, losses))}"
            )
        if reduce not in REDUCTIONS:
            raise ValueError(f"ensemble reduce must be one of {REDUCTIONS}, got {reduce!r}")
        lookbacks = [None] * len(learners) if lookbacks is None else list(lookbacks)
        if len(lookbacks) != len(learners) or any(
            n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1)
            for n in lookbacks
        ):
            raise ValueError(
                f"ensemble lookbacks must be one positive integer or None per member "
                f"({len(learners)}), got {lookbacks}"
            )
        self.lookbacks = lookbacks
        self.members = nn.ModuleList(learners)
        self.loss = losses.pop()
        self.reduce = reduce
        self.eval_inner_steps = getattr(learners[0], "eval_inner_steps", None)

    def _learners(self) -> list[Any]:
        """The members (learners with `adapt` and `predict`; a ModuleList types them as
        plain modules)."""
        return list(self.members)

    def adapt(self, support: TaskSet, steps: int | None = None) -> Params:
        """Every member's adapted state, keyed `"<member>/<name>"`."""
        check_support(support)
        params: Params = {}
        for i, member in enumerate(self._learners()):
            own = TaskSet(self._inputs(i, support.x), support.y)
            for name, value in member.adapt(own, steps=steps).items():
                params[f"{i}/{name}"] = value
        return params

    def predict(self, params: Params, x: Tensor) -> Tensor:
        """The reduction over members of each member's prediction with its own state."""
        predictions = []
        for i, member in enumerate(self._learners()):
            prefix = f"{i}/"
            own = {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}
            predictions.append(member.predict(own, self._inputs(i, x)))
        stacked = torch.stack(predictions)
        if self.reduce == "median":
            return torch.quantile(stacked, 0.5, dim=0)
        return stacked.mean(0)

    def _inputs(self, member: int, x: Tensor) -> Tensor:
        """`x [..., L, F]` cut to member's lookback (its most recent rows)."""
        rows = self.lookbacks[member]
        if rows is None:
            return x
        if rows > x.shape[-2]:
            raise ValueError(
                f"ensemble member {member} looks back {rows} rows; the windows hold {x.shape[-2]}"
            )
        return x[..., x.shape[-2] - rows :, :]
