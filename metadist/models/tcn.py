"""Temporal convolution network: causal dilated 1-D convolutions over a window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from metadist.models._common import (
    ConfigurableModel,
    denormalise_forecast,
    normalise_window,
    numel,
    positive_int,
    split_leading,
    window_norm_options,
    window_shape,
)
from metadist.models._common import activation as check_activation
from metadist.models.registry import register_model


class _CausalBlock(nn.Module):
    """conv(dilation d) → activation, plus a residual (1x1 conv when widths differ)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int, act):
        super().__init__()
        self.left_pad = (kernel_size - 1) * dilation
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation)
        self.act = act()
        self.skip = (
            nn.Conv1d(in_channels, out_channels, 1)
            if in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x: Tensor) -> Tensor:
        # Left padding only, so step t never sees steps after t.
        return self.act(self.conv(F.pad(x, (self.left_pad, 0)))) + self.skip(x)


@register_model("tcn")
class TCN(ConfigurableModel):
    """Stack of causal residual conv blocks with dilations 1, 2, 4, ...; the features of
    the last time step (or their mean over all steps) feed a linear head.

    Args:
        input_shape: `(L, F)`.
        output_shape: any, e.g. `(H, T)` or `(N,)`.
        options: `TCN.Options` (below), or its fields as keywords.

    Shapes: `[..., L, F]` → `[..., *output_shape]`.

    Raises:
        ValueError: an input_shape that is not `(L, F)`, or a bad option.
    """

    @dataclass(frozen=True)
    class Options:
        """The TCN's options (`model.options`).

        Attributes:
            channels: width of every block.
            kernel_size: temporal kernel size.
            num_levels: number of blocks (receptive field `1 + (k-1)(2^levels - 1)`).
            activation: "relu", "tanh", "gelu" or "silu".
            window_norm: "none", "last" or "mean": make each window relative to its own
                level (last value or mean) and scale, and map the forecast back, as the
                forecaster does (needs `output_shape` `(H, T)`).
            target_channels: with window_norm, the input feature index of each target;
                may be left out for one feature and one target.
            pool: which features feed the head: "last" (the last step's, for
                forecasting) or "mean" (the mean over all steps, for classifying whole
                series, whose class shows anywhere in them).
        """

        channels: int = 32
        kernel_size: int = 3
        num_levels: int = 3
        activation: str = "relu"
        window_norm: str = "none"
        target_channels: Sequence[int] | None = None
        pool: str = "last"

    model_name = "tcn"

    def __init__(
        self,
        input_shape: tuple[int, ...],
        output_shape: tuple[int, ...],
        *,
        options: Options | None = None,
        **keywords: Any,
    ) -> None:
        super().__init__()
        self.options: TCN.Options = self.read_options(keywords, options)
        opts = self.options
        if opts.pool not in ("last", "mean"):
            raise ValueError(f"model 'tcn': pool must be 'last' or 'mean', got {opts.pool!r}")
        self.pool = opts.pool
        self.input_shape = tuple(input_shape)
        self.output_shape = tuple(output_shape)
        _, num_features = window_shape(self.model_name, self.input_shape)
        channels = positive_int(self.model_name, "channels", opts.channels)
        kernel_size = positive_int(self.model_name, "kernel_size", opts.kernel_size)
        num_levels = positive_int(self.model_name, "num_levels", opts.num_levels)
        act = check_activation(self.model_name, opts.activation)
        blocks = []
        width = num_features
        for level in range(num_levels):
            blocks.append(_CausalBlock(width, channels, kernel_size, 2**level, act))
            width = channels
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, numel(self.output_shape))
        self.window_norm, self.target_channels = window_norm_options(
            self.model_name,
            opts.window_norm,
            opts.target_channels,
            self.input_shape,
            self.output_shape,
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.target_channels is None:
            return self._forward(x)
        x, level, scale = normalise_window(
            self.model_name, x, self.input_shape, self.window_norm, self.target_channels
        )
        return denormalise_forecast(self._forward(x), level, scale)

    def _forward(self, x: Tensor) -> Tensor:
        leading = split_leading(self.model_name, x, self.input_shape)
        windows = x.reshape(-1, *self.input_shape).transpose(1, 2)  # [N, F, L]
        features = self.body(windows)
        pooled = features[:, :, -1] if self.pool == "last" else features.mean(dim=2)
        return self.head(pooled).reshape(*leading, *self.output_shape)
