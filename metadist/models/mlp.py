"""Multi-layer perceptron (the sinusoid network of Finn et al.: 1-40-40-1, ReLU)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from metadist.models._common import ConfigurableModel, dropout_rate, numel, split_leading
from metadist.models._common import activation as check_activation
from metadist.models._common import hidden_sizes as check_hidden_sizes
from metadist.models.mlp_vjp import VJP, batched_vjp, mlp_layers
from metadist.models.registry import register_model
from metadist.models.thin_matmul import is_thin, thin_matmul


@register_model("mlp")
class MLP(ConfigurableModel):
    """Flattens one example, applies `hidden_sizes` Linear+activation layers and a linear head.

    Args:
        input_shape: shape of one example, e.g. `(1,)` or `(L, F)` (flattened).
        output_shape: shape of one prediction, e.g. `(1,)` or `(H, T)`.
        options: `MLP.Options` (below), or its fields as keywords.

    Shapes: `[..., *input_shape]` → `[..., *output_shape]`. `batched_forward` runs B
    parameter sets at once (what the learners use for a batch of tasks).

    Raises:
        ValueError: a bad option or (in `forward`) inputs whose trailing dims differ from
            `input_shape`.
    """

    @dataclass(frozen=True)
    class Options:
        """The MLP's options (`model.options`).

        Attributes:
            hidden_sizes: widths of the hidden layers.
            activation: "relu", "tanh", "gelu" or "silu".
            dropout: dropout after each hidden activation (0 disables it).
        """

        hidden_sizes: Sequence[int] = (40, 40)
        activation: str = "relu"
        dropout: float = 0.0

    model_name = "mlp"

    def __init__(
        self,
        input_shape: tuple[int, ...],
        output_shape: tuple[int, ...],
        *,
        options: Options | None = None,
        **keywords: Any,
    ) -> None:
        super().__init__()
        self.options: MLP.Options = self.read_options(keywords, options)
        self.input_shape = tuple(input_shape)
        self.output_shape = tuple(output_shape)
        widths = check_hidden_sizes(self.model_name, self.options.hidden_sizes)
        act = check_activation(self.model_name, self.options.activation)
        rate = dropout_rate(self.model_name, self.options.dropout)
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

    def batched_forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """The model under B parameter sets at once, one per task, as batched matmuls.

        Equals `torch.func.functional_call(self, {n: p[b] for n, p in params.items()},
        x[b])` for every b, without `vmap`.

        Args:
            params: every parameter of `named_parameters()`, each `[B, *shape]`.
            x: `[B, ..., *input_shape]`.

        Returns:
            `[B, ..., *output_shape]`.

        Raises:
            ValueError: inputs whose trailing dims differ from `input_shape`.
        """
        leading = split_leading(self.model_name, x, self.input_shape)
        # Examples-first activations [B, N, D]: each layer is h [B, N, D_in] @ W^T
        # [B, D_in, D_out], the layout in which every batched matmul of the forward, the
        # backward and the double backward runs fastest on the CPU (2-4x the features-first
        # W @ h [B, D_out, N] for the sinusoid's 40 x 40 layer).
        hidden = x.reshape(leading[0], -1, numel(self.input_shape))
        for index, layer in enumerate(self.body):
            if isinstance(layer, nn.Linear):
                hidden = _linear(params, f"body.{index}", hidden)
            else:
                hidden = layer(hidden)
        output = _linear(params, "head", hidden)
        return output.reshape(*leading, *self.output_shape)

    def batched_vjp(self, params: dict[str, Tensor], x: Tensor) -> tuple[Tensor, VJP] | None:
        """`batched_forward` and its backward written out as tensor ops
        (`metadist.models.mlp_vjp`): what the inner loop of the learners uses, where it can,
        in place of `torch.autograd.grad`.

        Args:
            params: every parameter of `named_parameters()`, each `[B, *shape]` (per task)
                or `[*shape]` (shared by all B tasks).
            x: `[B, ..., *input_shape]`.

        Returns:
            None where a layer has no written-out backward (active dropout), else the
            output `[B, ..., *output_shape]` and `vjp(grad_output, names)`: the gradients
            `[B, *shape]` of `(output * grad_output).sum()` w.r.t. the parameters `names`,
            differentiable again under grad mode.

        Raises:
            ValueError: inputs whose trailing dims differ from `input_shape`.
        """
        layers = mlp_layers(self.body, "head")
        if layers is None:
            return None
        leading = split_leading(self.model_name, x, self.input_shape)
        hidden = x.reshape(leading[0], -1, numel(self.input_shape))
        output, vjp = batched_vjp(layers, params, hidden)

        def flat_vjp(grad_output: Tensor, names: Collection[str]) -> dict[str, Tensor]:
            return vjp(grad_output.reshape(output.shape), names)

        return output.reshape(*leading, *self.output_shape), flat_vjp


def _linear(params: dict[str, Tensor], name: str, x: Tensor) -> Tensor:
    """`x [B, N, D_in]` through per-task weights `[B, D_out, D_in]` and biases `[B, D_out]`
    → `[B, N, D_out]`."""
    bias, weight_t = params[name + ".bias"].unsqueeze(1), params[name + ".weight"].transpose(1, 2)
    if is_thin(x, weight_t):  # a first or last layer of width 1 (`thin_matmul`)
        return thin_matmul(x, weight_t) + bias
    return torch.baddbmm(bias, x, weight_t)
