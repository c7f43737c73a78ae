"""GRU encoder: the last hidden state of a window feeds a linear head."""

from __future__ import annotations

from torch import Tensor, nn

from metadist.models._common import numel, positive_int, split_leading, window_shape
from metadist.models.registry import register_model


@register_model("gru")
class GRUModel(nn.Module):
    """`nn.GRU` over the window, then a linear head on the last output.

    `torch.func.vmap` has no batching rule for the fused GRU kernel, so learners run this
    model through their per-task loop (they detect that and say so once).

    Args:
        input_shape: `(L, F)`.
        output_shape: any, e.g. `(H, T)` or `(N,)`.
        hidden_size: GRU state width.
        num_layers: stacked GRU layers.

    Shapes: `[..., L, F]` → `[..., *output_shape]`.

    Raises:
        ValueError: an input_shape that is not `(L, F)`, or a bad option.
    """

    model_name = "gru"

    def __init__(
        self,
        input_shape: tuple[int, ...],
        output_shape: tuple[int, ...],
        hidden_size: int = 32,
        num_layers: int = 1,
    ) -> None:
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.output_shape = tuple(output_shape)
        _, num_features = window_shape(self.model_name, self.input_shape)
        hidden_size = positive_int(self.model_name, "hidden_size", hidden_size)
        num_layers = positive_int(self.model_name, "num_layers", num_layers)
        self.body = nn.GRU(num_features, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, numel(self.output_shape))

    def forward(self, x: Tensor) -> Tensor:
        leading = split_leading(self.model_name, x, self.input_shape)
        outputs, _ = self.body(x.reshape(-1, *self.input_shape))
        return self.head(outputs[:, -1]).reshape(*leading, *self.output_shape)
