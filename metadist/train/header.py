"""The first line a training prints: what the run trains on, and how its units are split."""

from __future__ import annotations

from metadist.data.splits import split_protocol
from metadist.train.build import RunParts
from metadist.train.config import TrainConfig
from metadist.train.distributed import DistEnv


def run_header(config: TrainConfig, env: DistEnv, parts: RunParts) -> str:
    """One line saying what the run trains on: store (entities, scaling, checksum checked),
    sampler, learner, model, steps, ranks and device."""
    data = "no store"
    if parts.store is not None:
        identity = parts.store_identity or {}
        checked = "checksums verified" if config.data.verify_store else "checksums not verified"
        data = (
            f"store {config.data.store} ({identity.get('num_entities')} entities, "
            f"scaling {identity.get('scaling')}, {checked})"
        )
    return (
        f"{config.experiment or 'run'}: {data}; sampler {config.sampler.name} "
        f"({parts.sampler.num_units} units, split by {resolved_split_by(config, parts)}); "
        f"{_learner(config)} on {config.model.name}; {config.trainer.meta_steps} meta-steps "
        f"on {env.world_size} rank(s), {env.device.type}"
    )


def _learner(config: TrainConfig) -> str:
    """The learner's name, and "first order" where its option says so (`learner=fomaml`
    is maml with `first_order: true`)."""
    first_order = (config.learner.options or {}).get("first_order")
    return f"{config.learner.name} (first order)" if first_order else config.learner.name


def resolved_split_by(config: TrainConfig, parts: RunParts) -> str:
    """`data.split_by` as the run got it: `auto` with the protocol it resolved to."""
    split_by = config.data.split_by or "unit"
    if split_by != "auto":
        return split_by
    protocol = split_protocol(parts.sampler, parts.store, config.data.fractions, split_by)
    return f"auto ({protocol})"
