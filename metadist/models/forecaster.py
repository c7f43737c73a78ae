"""Windowed MLP forecaster: a window `[L, F]` in, a horizon `[H, T]` out."""

from __future__ import annotations

from collections.abc import Sequence

from metadist.models import register_model
from metadist.models._common import window_shape
from metadist.models.mlp import MLP


@register_model("forecaster")
class WindowForecaster(MLP):
    """An MLP over the flattened window that predicts the whole horizon at once.

    Args:
        input_shape: `(L, F)`, window length and number of features.
        output_shape: `(H, T)`, horizon and number of targets (any shape works, e.g.
            `(N,)` to classify windows).
        hidden_sizes: widths of the hidden layers.
        activation: "relu", "tanh", "gelu" or "silu".
        dropout: dropout after each hidden activation.

    Shapes: `[..., L, F]` → `[..., H, T]`.

    Raises:
        ValueError: an input_shape that is not `(L, F)`, or a bad option.
    """

    model_name = "forecaster"

    def __init__(
        self,
        input_shape: tuple[int, ...],
        output_shape: tuple[int, ...],
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "relu",
        dropout: float = 0.0,
    ) -> None:
        window_shape(self.model_name, tuple(input_shape))
        super().__init__(input_shape, output_shape, hidden_sizes, activation, dropout)
