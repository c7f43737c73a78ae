"""GRU encoder: the last hidden state of a window feeds a linear head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from metadist.models._common import (
    ConfigurableModel,
    numel,
    positive_int,
    split_leading,
    window_shape,
)
from metadist.models.registry import register_model


@register_model("gru")
class GRUModel(ConfigurableModel):
    """`nn.GRU` over the window, then a linear head on the last output.

    `torch.func.vmap` has no batching rule for the fused GRU kernel, so learners run this
    model through their per-task loop (they detect that and say so once).

    Args:
        input_shape: `(L, F)`.
        output_shape: any, e.g. `(H, T)` or `(N,)`.
        options: `GRUModel.Options` (below), or its fields as keywords.

    Shapes: `[..., L, F]` → `[..., *output_shape]`.

    Raises:
        ValueError: an input_shape that is not `(L, F)`, or a bad option.
    """

    @dataclass(frozen=True)
    class Options:
        """The GRU's options (`model.options`).

        Attributes:
            hidden_size: GRU state width.
            num_layers: stacked GRU layers.
        """

        hidden_size: int = 32
        num_layers: int = 1

    model_name = "gru"

    def __init__(
        self,
        input_shape: tuple[int, ...],
        output_shape: tuple[int, ...],
        *,
        options: Options | None = None,
        **keywords: Any,
    ) -> None:
        super().__init__()
        self.options: GRUModel.Options = self.read_options(keywords, options)
        self.input_shape = tuple(input_shape)
        self.output_shape = tuple(output_shape)
        _, num_features = window_shape(self.model_name, self.input_shape)
        hidden_size = positive_int(self.model_name, "hidden_size", self.options.hidden_size)
        num_layers = positive_int(self.model_name, "num_layers", self.options.num_layers)
        self.body = nn.GRU(num_features, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, numel(self.output_shape))

    def forward(self, x: Tensor) -> Tensor:
        leading = split_leading(self.model_name, x, self.input_shape)
        outputs, _ = self.body(x.reshape(-1, *self.input_shape))
        return self.head(outputs[:, -1]).reshape(*leading, *self.output_shape)
