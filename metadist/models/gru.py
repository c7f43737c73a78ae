"""GRU encoder: the last hidden state of a window feeds a linear head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

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

    On the CPU, `torch.func.vmap` has no batching rule for the fused GRU kernel, so
    learners run this model through their per-task loop (they detect that and say so
    once). On a GPU the recurrence is written out (`gru_recurrence`): cuDNN's fused kernel
    accepts neither vmap's batched weights nor a second derivative (MAML's), and the
    written-out steps take both, so learners batch their tasks there.

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
        flat = x.reshape(-1, *self.input_shape)
        if flat.is_cuda:
            outputs = gru_recurrence(self.body, flat)
        else:
            outputs, _ = self.body(flat)
        return self.head(outputs[:, -1]).reshape(*leading, *self.output_shape)


def gru_recurrence(gru: nn.GRU, x: Tensor) -> Tensor:
    """`gru(x)[0]` for a batch-first, unidirectional `nn.GRU` from a zero state, with its
    equations written out step by step (`torch.nn.GRU`'s, gates in its order r, z, n):
    every operation has a vmap batching rule and a second derivative.

    Shapes: `x [N, L, F]` → `[N, L, hidden_size]`.
    """
    out = x
    for layer in range(gru.num_layers):
        w_ih, w_hh = getattr(gru, f"weight_ih_l{layer}"), getattr(gru, f"weight_hh_l{layer}")
        b_ih = getattr(gru, f"bias_ih_l{layer}") if gru.bias else None
        b_hh = getattr(gru, f"bias_hh_l{layer}") if gru.bias else None
        inputs = F.linear(out, w_ih, b_ih)  # every step's input gates in one product
        h = out.new_zeros(out.shape[0], gru.hidden_size)
        steps = []
        for t in range(out.shape[1]):
            i_r, i_z, i_n = inputs[:, t].chunk(3, dim=-1)
            h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, dim=-1)
            r = torch.sigmoid(i_r + h_r)
            z = torch.sigmoid(i_z + h_z)
            n = torch.tanh(i_n + r * h_n)
            h = n + z * (h - n)
            steps.append(h)
        out = torch.stack(steps, dim=1)
    return out
