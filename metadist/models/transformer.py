"""Small Transformer encoder over the time steps of a window."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from metadist.models._common import (
    ConfigurableModel,
    dropout_rate,
    numel,
    positive_int,
    split_leading,
    window_shape,
)
from metadist.models.registry import register_model


class CompositeLayerNorm(nn.Module):
    """Layer norm over the last dim written with elementary ops.

    `nn.LayerNorm`'s fused kernel has a wrong batching rule for its double backward
    (pytorch/functorch#534): second-order MAML under `vmap` gets a wrong meta-gradient
    through it. Mean/variance/rsqrt have correct rules, so this layer is safe to vmap.
    """

    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        variance = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) * torch.rsqrt(variance + self.eps) * self.weight + self.bias


class _EncoderLayer(nn.Module):
    """Pre-norm self-attention + feed-forward block.

    Attention is written out (not `nn.MultiheadAttention`/SDPA) and layer norm is
    composite, so that every op has a batching rule under `vmap` and a correct double
    backward for second-order MAML on every backend.
    """

    def __init__(self, d_model: int, num_heads: int, ff_size: int, dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = CompositeLayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = CompositeLayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, ff_size), nn.GELU(), nn.Linear(ff_size, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:  # [N, L, D]
        n, length, d_model = x.shape
        head_dim = d_model // self.num_heads
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (
            t.reshape(n, length, self.num_heads, head_dim).transpose(1, 2) for t in (q, k, v)
        )
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(n, length, d_model)
        x = x + self.drop(self.proj(attended))
        return x + self.drop(self.ff(self.norm2(x)))


@register_model("transformer")
class TransformerEncoder(ConfigurableModel):
    """Linear embedding of each time step + learned positions, `num_layers` encoder
    layers, and a linear head on the last time step.

    Args:
        input_shape: `(L, F)`.
        output_shape: any, e.g. `(H, T)` or `(N,)`.
        options: `TransformerEncoder.Options` (below), or its fields as keywords.

    Shapes: `[..., L, F]` → `[..., *output_shape]`.

    Raises:
        ValueError: an input_shape that is not `(L, F)`, `d_model` not divisible by
            `num_heads`, or a bad option.
    """

    @dataclass(frozen=True)
    class Options:
        """The Transformer's options (`model.options`).

        Attributes:
            d_model: embedding width (divisible by `num_heads`).
            num_heads: attention heads.
            num_layers: encoder layers.
            ff_size: feed-forward width.
            dropout: dropout rate (0 by default: inner loops want deterministic forwards).
        """

        d_model: int = 32
        num_heads: int = 4
        num_layers: int = 2
        ff_size: int = 64
        dropout: float = 0.0

    model_name = "transformer"

    def __init__(
        self,
        input_shape: tuple[int, ...],
        output_shape: tuple[int, ...],
        *,
        options: Options | None = None,
        **keywords: Any,
    ) -> None:
        super().__init__()
        self.options: TransformerEncoder.Options = self.read_options(keywords, options)
        opts = self.options
        self.input_shape = tuple(input_shape)
        self.output_shape = tuple(output_shape)
        length, num_features = window_shape(self.model_name, self.input_shape)
        d_model = positive_int(self.model_name, "d_model", opts.d_model)
        num_heads = positive_int(self.model_name, "num_heads", opts.num_heads)
        num_layers = positive_int(self.model_name, "num_layers", opts.num_layers)
        ff_size = positive_int(self.model_name, "ff_size", opts.ff_size)
        if d_model % num_heads:
            raise ValueError(
                f"model 'transformer': d_model ({d_model}) must be divisible by "
                f"num_heads ({num_heads})"
            )
        rate = dropout_rate(self.model_name, opts.dropout)
        self.embed = nn.Linear(num_features, d_model)
        self.position = nn.Parameter(torch.randn(length, d_model) * 0.02)
        self.body = nn.Sequential(
            *(_EncoderLayer(d_model, num_heads, ff_size, rate) for _ in range(num_layers))
        )
        self.norm = CompositeLayerNorm(d_model)
        self.head = nn.Linear(d_model, numel(self.output_shape))

    def forward(self, x: Tensor) -> Tensor:
        leading = split_leading(self.model_name, x, self.input_shape)
        tokens = self.embed(x.reshape(-1, *self.input_shape)) + self.position
        last = self.norm(self.body(tokens))[:, -1]
        return self.head(last).reshape(*leading, *self.output_shape)
