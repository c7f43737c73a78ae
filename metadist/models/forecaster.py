"""Windowed MLP forecaster: a window `[L, F]` in, a horizon `[H, T]` out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from metadist.models._common import (
    denormalise_forecast,
    normalise_window,
    window_norm_options,
    window_shape,
)
from metadist.models.mlp import MLP
from metadist.models.registry import register_model


@register_model("forecaster")
class WindowForecaster(MLP):
    """An MLP over the flattened window that predicts the whole horizon at once.

    With `window_norm` "last" or "mean", every window is made relative to its own level
    (its last value or its mean) and scale (root-mean-square deviation from that level)
    before the MLP, and the forecast is mapped back (`y · scale + level`), in `forward`
    and in `batched_forward` alike: the network learns shapes, not levels, and a window
    `a · x + b` (a > 0) is forecast as `a · f(x) + b`. Predictions, losses and adaptation
    stay in the data's units.

    Args:
        input_shape: `(L, F)`, window length and number of features.
        output_shape: `(H, T)`, horizon and number of targets (any shape works without
            window_norm, e.g. `(N,)` to classify windows).
        options: `WindowForecaster.Options` (below; `MLP`'s and its own), or their
            fields as keywords.

    Shapes: `[..., L, F]` → `[..., H, T]`.

    Raises:
        ValueError: an input_shape that is not `(L, F)`, or a bad option.
    """

    @dataclass(frozen=True)
    class Options(MLP.Options):
        """The forecaster's options: `MLP.Options` (wider by default) and its own.

        Attributes:
            hidden_sizes: widths of the hidden layers (64, 64 here).
            window_norm: "none", "last" or "mean" (see above).
            target_channels: with window_norm, the input feature index of each target
                (the positions of the sampler's `target_columns` in its
                `input_columns`); may be left out for one feature and one target.
        """

        hidden_sizes: Sequence[int] = (64, 64)
        window_norm: str = "none"
        target_channels: Sequence[int] | None = None

    options: WindowForecaster.Options
    model_name = "forecaster"

    def __init__(
        self,
        input_shape: tuple[int, ...],
        output_shape: tuple[int, ...],
        *,
        options: Options | None = None,
        **keywords: Any,
    ) -> None:
        window_shape(self.model_name, tuple(input_shape))
        super().__init__(input_shape, output_shape, options=options, **keywords)
        self.window_norm, self.target_channels = window_norm_options(
            self.model_name,
            self.options.window_norm,
            self.options.target_channels,
            self.input_shape,
            self.output_shape,
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.target_channels is None:
            return super().forward(x)
        x, level, scale = normalise_window(
            self.model_name, x, self.input_shape, self.window_norm, self.target_channels
        )
        return denormalise_forecast(super().forward(x), level, scale)

    def batched_forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """`forward` under B parameter sets at once (see `MLP.batched_forward`).

        Args:
            params: every parameter of `named_parameters()`, each `[B, *shape]`.
            x: `[B, ..., L, F]`.

        Returns:
            `[B, ..., H, T]`.

        Raises:
            ValueError: inputs whose trailing dims differ from `input_shape`.
        """
        if self.target_channels is None:
            return super().batched_forward(params, x)
        x, level, scale = normalise_window(
            self.model_name, x, self.input_shape, self.window_norm, self.target_channels
        )
        return denormalise_forecast(super().batched_forward(params, x), level, scale)
