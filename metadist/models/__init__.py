"""Models: plain `nn.Module`s that map `[..., *input_shape]` → `[..., *output_shape]`.

Every model is built from the shapes of the task family it serves, e.g. `(1,)` → `(1,)`
for sinusoid regression, `(L, F)` → `(H, T)` for forecasting windows, `(L, F)` → `(N,)`
for N-way classification or `(L, F)` → `(D,)` for a prototypical-network embedding. Any
number of leading dimensions (windows, tasks) is carried through. Each model keeps its
last layer as the sub-module `head`, which is what ANIL adapts.

Importing this package registers the built-in models.
"""

from __future__ import annotations

from metadist.models import forecaster, gru, mlp, nbeats, tcn, transformer  # noqa: E402, F401
from metadist.models._common import ConfigurableModel
from metadist.models.registry import (
    MODELS,
    build_model,
    get_model,
    register_model,
    registered_models,
)

__all__ = [
    "MODELS",
    "ConfigurableModel",
    "build_model",
    "get_model",
    "register_model",
    "registered_models",
]
