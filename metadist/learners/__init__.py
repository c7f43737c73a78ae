"""Learners: MAML, first-order MAML, Meta-SGD, ANIL, Reptile, Prototypical Networks,
Meta-Baseline (and with a fine-tuned head: SGD or Adam steps).

Importing this package registers the built-in learners.

Example:
    >>> from metadist.learners import build_learner
    >>> from metadist.models import build_model
    >>> model = build_model("mlp", (1,), (1,), hidden_sizes=(40, 40))
    >>> learner = build_learner("maml", model, inner_steps=1, inner_lr=0.01)
    >>> out = learner(batch)            # MetaOutput: out.loss.backward()
    >>> params = learner.adapt(batch.support, steps=10)
    >>> prediction = learner.predict(params, batch.query.x)
"""

from metadist.learners import (  # noqa: F401  (registers them)
    anil,
    maml,
    metabaseline,
    metabaseline_adam,
    metabaseline_ft,
    metabaseline_tune,
    metasgd,
    protonet,
    reptile,
)
from metadist.learners.base import InnerLoopLearner, Learner, MetaOutput
from metadist.learners.losses import LOSSES, REGRESSION_LOSSES, task_loss, task_losses
from metadist.learners.registry import (
    LEARNERS,
    build_learner,
    get_learner,
    register_learner,
    registered_learners,
)

__all__ = [
    "LEARNERS",
    "LOSSES",
    "REGRESSION_LOSSES",
    "InnerLoopLearner",
    "Learner",
    "MetaOutput",
    "build_learner",
    "get_learner",
    "register_learner",
    "registered_learners",
    "task_loss",
    "task_losses",
]
