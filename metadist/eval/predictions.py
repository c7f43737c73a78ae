"""What each method predicts for a batch's queries: the meta-trained model, adapted on
the support set and not, and the same network trained from scratch on it.

`rolled_forecast` rolls a model's forecasts forward when the query horizon is longer than
the model's (`metadist.api` forecasts with it too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from metadist.batch import MetaBatch
from metadist.eval import baselines
from metadist.eval.cache import CACHE_VERSION, EvalCache, digest, model_digest
from metadist.eval.classification_scoring import classification_baselines
from metadist.eval.settings import EvalOptions


class Predictor:
    """`batch -> {method: predictions}` of the meta-trained model (adapted, and unadapted
    when scored) and, for tasks of `kind` classification, of the non-meta-learned
    classifiers (`pretrained`: the pretrained-embedding baseline's backbone, or `None`;
    `examples_normalised`, `cache`: see `classification_baselines`)."""

    def __init__(
        self,
        learner: nn.Module,
        options: EvalOptions,
        unadapted: bool,
        kind: str,
        pretrained: nn.Module | None,
        examples_normalised: bool = False,
        cache: EvalCache | None = None,
    ) -> None:
        self.learner = learner
        self.options = options
        self.unadapted = unadapted
        self.classification = kind == "classification"
        self.pretrained = pretrained
        self.examples_normalised = examples_normalised
        self.cache = cache

    def __call__(self, batch: MetaBatch) -> dict[str, torch.Tensor]:
        out = model_predictions(self.learner, batch, self.options, self.unadapted)
        if self.classification:
            out.update(
                classification_baselines(
                    batch, self.pretrained, self.examples_normalised, self.cache
                )
            )
        return out


class ScratchBaseline:
    """The same network trained from scratch on each support set, from one seeded
    initialisation (built on first use), on `device` (default: the CPU).

    With a `cache`, a batch's predictions are taken from it when it holds them (the key:
    the batch's inputs, the initial network, the settings and the device) and kept in it
    otherwise. `counter` (a `metadist.progress` counter) is advanced by the task-steps
    trained.
    """

    def __init__(
        self,
        fresh_model: Callable[[], nn.Module],
        options: EvalOptions,
        loss: str,
        device: torch.device | str | None = None,
        cache: EvalCache | None = None,
    ) -> None:
        self.fresh_model = fresh_model
        self.options = options
        self.loss = loss
        self.device = torch.device(device or "cpu")
        self.cache = cache
        self.counter: Any = None
        self.done = 0
        self.template: nn.Module | None = None
        self._template_key = ""

    def __call__(self, batch: MetaBatch) -> torch.Tensor:
        if self.template is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.options.seed)
                self.template = self.fresh_model().to(self.device)
            self._template_key = model_digest(self.template)
        key = digest(
            "scratch",
            CACHE_VERSION,
            self._template_key,
            self.options.scratch_steps,
            self.options.scratch_lr,
            self.loss,
            self.device.type,
            batch.support.x,
            batch.support.y,
            batch.query.x,
            list(batch.query.y.shape),
        )
        found = None if self.cache is None else self.cache.get("from-scratch predictions", key)
        if found is not None:
            self._advance(batch.num_tasks * self.options.scratch_steps)
            return torch.from_numpy(found)
        predictions = self._fit_and_predict(batch.to(self.device)).cpu()
        if self.cache is not None:
            self.cache.put("from-scratch predictions", key, predictions)
        return predictions

    def _fit_and_predict(self, batch: MetaBatch) -> torch.Tensor:
        assert self.template is not None  # built by __call__
        num_tasks = batch.num_tasks
        params = baselines.fit_from_scratch(
            self.template,
            batch.support.x,
            batch.support.y,
            steps=self.options.scratch_steps,
            lr=self.options.scratch_lr,
            loss=self.loss,
            on_step=lambda step: self._advance(num_tasks),
        )
        return rolled_forecast(stacked_predictor(self.template, params), batch)

    def _advance(self, task_steps: int) -> None:
        self.done += task_steps
        if self.counter is not None:
            self.counter.update(self.done)


def stacked_predictor(model: nn.Module, params: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """`x -> predictions` of `model` with the per-task parameters `params`."""

    def predict(x: torch.Tensor) -> torch.Tensor:
        return baselines.predict_stacked(model, params, x)

    return predict


def model_predictions(
    learner: Any, batch: MetaBatch, options: EvalOptions, unadapted: bool = True
) -> dict[str, torch.Tensor]:
    """`{"adapted": ..., "unadapted": ...}` query predictions of the meta-trained `learner`
    (adapted with `options.inner_steps` steps, and with none), on the learner's device."""
    parameter = next(learner.parameters(), None)  # on the run's device (trainer.device)
    if parameter is not None:
        batch = batch.to(parameter.device, non_blocking=True)
    with torch.no_grad():
        adapted = learner.adapt(batch.support, steps=options.inner_steps)
        out = {"adapted": rolled_forecast(lambda x: learner.predict(adapted, x), batch)}
        if unadapted:
            before = learner.adapt(batch.support, steps=0)
            out["unadapted"] = rolled_forecast(lambda x: learner.predict(before, x), batch)
        return out


def rolled_forecast(
    predict: Callable[[torch.Tensor], torch.Tensor], batch: MetaBatch
) -> torch.Tensor:
    """Predictions for `batch.query.x`, rolled forward when the query horizon is longer.

    A model predicting H' steps forecasts a longer query horizon H by feeding its own
    forecasts back as inputs, H' steps at a time (the inputs must then be the targets:
    `query.x [B, Q, L, T]`).
    """
    x = batch.query.x
    target = batch.query.y
    prediction = predict(x)
    if target.dim() != 4 or prediction.dim() != 4 or prediction.shape[2] >= target.shape[2]:
        return prediction if target.dim() != 4 else prediction[:, :, : target.shape[2]]
    if x.shape[-1] != prediction.shape[-1]:
        raise ValueError(
            f"the query horizon {target.shape[2]} is longer than the model's horizon "
            f"{prediction.shape[2]}, and rolling forecasts forward needs the inputs to be the "
            f"targets, but the model reads {x.shape[-1]} input columns and predicts "
            f"{prediction.shape[-1]}"
        )
    pieces = [prediction]
    done = prediction.shape[2]
    lookback = x.shape[2]
    while done < target.shape[2]:
        x = torch.cat([x, pieces[-1]], dim=2)[:, :, -lookback:]
        pieces.append(predict(x))
        done += pieces[-1].shape[2]
    return torch.cat(pieces, dim=2)[:, :, : target.shape[2]]
