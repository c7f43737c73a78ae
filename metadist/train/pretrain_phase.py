"""A run's classifier pre-training phase (`pretrain.steps > 0`), before its first meta-step.

Meta-Baseline's first stage (Chen et al., 2021): the model is trained as an ordinary
classifier of the meta-train classes, then meta-training starts from it. An embedding
network (Prototypical Networks, Meta-Baseline: `model.output_shape` `[D]`) is trained
with a linear head `D → C`; a classifier for the inner-loop learners (MAML and its
family) is trained on the features its head receives, with a head of the phase's own:
the learner's head is left as it was, so its ways start from the head it had.

The phase runs only in a fresh run (no checkpoint yet): once meta-training has saved a
checkpoint, the pretrained weights are in it. Rank 0 saves the phase's state to
`run_dir/pretrain.pt` every `pretrain.save_every` steps, so a run killed during the phase
resumes it exactly; every rank computes the same steps from the same seed, and DDP
starts every rank from rank 0's weights anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor, nn

from metadist.learners.heads import resolve_head
from metadist.train.build import RunParts
from metadist.train.config import TrainConfig
from metadist.train.distributed import DistEnv
from metadist.train.pretrain import PRETRAIN_STATE, pretrain_classifier

__all__ = ["PRETRAIN_STATE", "check_pretraining", "run_pretraining"]


def run_pretraining(
    config: TrainConfig, env: DistEnv, parts: RunParts, message: Callable[[str], None]
) -> None:
    """Pre-trains `parts.learner`'s model in place as `config.pretrain` says (nothing when
    `pretrain.steps` is 0).

    Raises:
        ValueError: the sampler gives no labelled examples, or the model's output is not
            an embedding or a head over features.
    """
    settings = config.pretrain
    if settings.steps == 0:
        return
    check_pretraining(config, parts)
    labelled = parts.sampler.labelled_examples  # type: ignore[attr-defined]  # checked
    examples, num_classes = labelled(parts.partitioner.units("train"))
    features, embedding_size = _features_of(parts.learner.model, parts, config)
    message(
        f"classifier pre-training: {settings.steps} steps over {num_classes} meta-train "
        f"classes ({embedding_size} features)"
    )

    def report(step: int, loss: float) -> None:
        message(f"classifier pre-training: step {step}/{settings.steps}, loss {loss:.4f}")

    pretrain_classifier(
        features,
        examples,
        num_classes=num_classes,
        embedding_size=embedding_size,
        steps=settings.steps,
        lr=settings.lr,
        batch_size=settings.batch_size,
        seed=config.trainer.seed,
        state_path=config.resolved_run_dir / PRETRAIN_STATE if env.is_main else None,
        save_every=settings.save_every,
        name="pretrain",
        on_save=report if env.is_main else None,
    )


def check_pretraining(config: TrainConfig, parts: RunParts) -> None:
    """Refuses a pre-training phase the run's parts cannot have, before anything of the
    run is written: a sampler without labelled examples, or an inner-loop learner's model
    whose head is not a linear layer (nothing when `pretrain.steps` is 0).

    Raises:
        ValueError: naming `pretrain.steps` and what is missing.
    """
    steps = config.pretrain.steps
    if steps == 0:
        return
    if getattr(parts.sampler, "labelled_examples", None) is None:
        raise ValueError(
            f"pretrain.steps={steps}: sampler {config.sampler.name!r} gives no "
            "labelled examples (a labelled_examples(units) method, as nway_kshot has); "
            "set pretrain.steps=0"
        )
    _features_of(parts.learner.model, parts, config)


def _features_of(model: nn.Module, parts: RunParts, config: TrainConfig) -> tuple[nn.Module, int]:
    """`(module giving features [N, D], D)`: the model itself when it is an embedding
    network, else a view of the model that returns what its head receives."""
    if not getattr(parts.learner, "has_inner_loop", True):
        return model, math.prod(parts.output_shape)
    name = resolve_head(model, None, config.learner.name)
    head = model.get_submodule(name)
    size = getattr(head, "in_features", None)
    if not isinstance(size, int):
        raise ValueError(
            f"pretrain.steps={config.pretrain.steps}: the model's head {name!r} is not a "
            "linear layer (no in_features); pre-training needs one"
        )
    return _HeadInputs(model, head), size


class _HeadInputs(nn.Module):
    """The model run as it is, returning the input of its head `[N, D]` (the features);
    the head's own output is discarded, so the head is not trained by the phase."""

    def __init__(self, model: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._head = [head]  # not a sub-module: its parameters stay out of the phase

    def forward(self, x: Tensor) -> Tensor:
        captured: list[Tensor] = []

        def keep(module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            captured.append(inputs[0])

        handle = self._head[0].register_forward_pre_hook(keep)
        try:
            self.model(x)
        finally:
            handle.remove()
        return captured[0].reshape(x.shape[0], -1)
