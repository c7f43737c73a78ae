"""Multi-layer perceptron (the sinusoid network of Finn et al.: 1-40-40-1, ReLU)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from metadist.models import register_model
from metadist.models._common import activation as check_activation
from metadist.models._common import dropout_rate, numel, split_leading
from metadist.models._common import hidden_sizes as check_hidden_sizes


@register_model("mlp")
class MLP(nn.Module):
    """Flattens one example, applies `hidden_sizes` Linear+activation layers and a linear head.

    Args:
        input_shape: shape of one example, e.g. `(1,)` or `(L, F)` (flattened).
        output_shape: shape of one prediction, e.g. `(1,)` or `(H, T)`.
        hidden_sizes: widths of the hidden layers.
        activation: "relu", "tanh", "gelu" or "silu".
        dropout: dropout after each hidden activation (0 disables it).

    Shapes: `[..., *input_shape]` → `[..., *output_shape]`.

    Raises:
        ValueError: a bad option or (in `forward`) inputs whose trailing dims differ from
            `input_shape`.
    """

    model_name = "mlp"

    def __init__(
        self,
        input_shape: tuple[int, ...],
        output_shape: tuple[int, ...],
        hidden_sizes: Sequence[int] = (40, 40),
        activation: str = "relu",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.output_shape = tuple(output_shape)
        widths = check_hidden_sizes(self.model_name, hidden_sizes)
        act = check_activation(self.model_name, activation)
        rate = dropout_rate(self.model_name, dropout)
        layers: list[nn.Module] = []
        width = numel(self.input_shape)
        for hidden in widths:
            layers += [nn.Linear(width, hidden), act()]
            if rate > 0:
                layers.append(nn.Dropout(rate))
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, numel(self.output_shape))

    def forward(self, x: Tensor) -> Tensor:
        leading = split_leading(self.model_name, x, self.input_shape)
        features = self.body(x.reshape(*leading, -1))
        return self.head(features).reshape(*leading, *self.output_shape)
