"""Meta-training: typed configs, the DDP training loop, checkpoints, logging, signals.

Example:
    >>> from metadist.train import load_config, train
    >>> config = load_config(["experiment=sinusoid_maml", "trainer.meta_steps=100"])
    >>> result = train(config)        # alone, or in every rank under torchrun
"""

from metadist.train.checkpoint import (
    CheckpointError,
    latest_checkpoint_state,
    load_checkpoint,
    save_checkpoint,
)
from metadist.train.compose import find_experiments_dir, load_config
from metadist.train.config import TrainConfig, build_config
from metadist.train.loop import NonFiniteLossError, TrainResult, train

__all__ = [
    "CheckpointError",
    "NonFiniteLossError",
    "TrainConfig",
    "TrainResult",
    "build_config",
    "find_experiments_dir",
    "latest_checkpoint_state",
    "load_checkpoint",
    "load_config",
    "save_checkpoint",
    "train",
]
