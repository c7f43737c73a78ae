"""Windowed MLP forecaster: a window `[L, F]` in, a horizon `[H, T]` out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from metadist.models._common import (
    WINDOW_NORMS,
    normalise_window,
    split_leading,
    window_norm_options,
    window_shape,
)
from metadist.models.mlp import MLP
from metadist.models.mlp_vjp import VJP
from metadist.models.registry import register_model
from metadist.models.seasonal import SEASONALITIES, SeasonalNorm
from metadist.models.window_vjp import AffineMap, SeasonalMap, WindowMap, window_vjp

FORECASTER_NORMS = (*WINDOW_NORMS, "seasonal")
HEAD_INITS = ("default", "zero")


@register_model("forecaster")
class WindowForecaster(MLP):
    """An MLP over the flattened window that predicts the whole horizon at once.

    With `window_norm` "last" or "mean", every window is made relative to its own level
    (its last value or its mean) and scale (root-mean-square deviation from that level)
    before the MLP, and the forecast is mapped back (`y · scale + level`), in `forward`
    and in `batched_forward` alike: the network learns shapes, not levels, and a window
    `a · x + b` (a > 0) is forecast as `a · f(x) + b`. Predictions, losses and adaptation
    stay in the data's units.

    With `window_norm="seasonal"`, each window is also deseasonalised first, with
    seasonal indices of period `seasonal_period` estimated from the window itself, and
    the forecast reseasonalised; `clamp` keeps forecasts near the window's range
    (`metadist.models.seasonal.SeasonalNorm`).

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
            window_norm: "none", "last", "mean" or "seasonal" (see above).
            target_channels: with window_norm, the input feature index of each target
                (the positions of the sampler's `target_columns` in its
                `input_columns`); may be left out for one feature and one target.
            seasonal_period: with window_norm "seasonal", the period m (1: none; a
                window shorter than 2m has none either).
            seasonality: with window_norm "seasonal", "multiplicative" (for windows of
                positive values; the others additive) or "additive".
            clamp: with window_norm "seasonal", c: forecasts are kept within
                `[min − c·range, max + c·range]` of the window's target values; None
                for no clamp.
            head_init: "default" (PyTorch's initialisation of the output layer) or
                "zero": the output layer starts at zero, so that with a window_norm
                the untrained model forecasts the window's level (reseasonalised under
                "seasonal": seasonal naive's forecast of a seasonal window) and
                training learns a correction to it.
        """

        hidden_sizes: Sequence[int] = (64, 64)
        window_norm: str = "none"
        target_channels: Sequence[int] | None = None
        seasonal_period: int = 1
        seasonality: str = "multiplicative"
        clamp: float | None = None
        head_init: str = "default"

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
            FORECASTER_NORMS,
        )
        self.seasonal_norm = self._seasonal_norm()
        if self.options.head_init not in HEAD_INITS:
            raise ValueError(
                f"model {self.model_name!r}: head_init must be one of {', '.join(HEAD_INITS)}, "
                f"got {self.options.head_init!r}"
            )
        if self.options.head_init == "zero":
            with torch.no_grad():
                self.head.weight.zero_()
                self.head.bias.zero_()

    def _seasonal_norm(self) -> SeasonalNorm | None:
        """The seasonal normalisation under window_norm "seasonal"; its options checked.

        Raises:
            ValueError: a bad seasonal_period, seasonality or clamp, or one of them set
                without window_norm "seasonal".
        """
        opts, name = self.options, self.model_name
        if isinstance(opts.seasonal_period, bool) or int(opts.seasonal_period) < 1:
            raise ValueError(
                f"model {name!r}: seasonal_period must be an integer >= 1, "
                f"got {opts.seasonal_period!r}"
            )
        if opts.seasonality not in SEASONALITIES:
            raise ValueError(
                f"model {name!r}: seasonality must be one of {', '.join(SEASONALITIES)}, "
                f"got {opts.seasonality!r}"
            )
        if opts.clamp is not None and not float(opts.clamp) >= 0.0:
            raise ValueError(f"model {name!r}: clamp must be >= 0 or null, got {opts.clamp!r}")
        if self.window_norm != "seasonal":
            neutral = (("seasonal_period", 1), ("seasonality", "multiplicative"), ("clamp", None))
            for field, value in neutral:
                if getattr(opts, field) != value:
                    raise ValueError(
                        f"model {name!r}: {field} applies with window_norm: seasonal only, "
                        f"got window_norm={self.window_norm!r}"
                    )
            return None
        assert self.target_channels is not None
        (lookback, num_features), (horizon, _) = self.input_shape, self.output_shape
        return SeasonalNorm(
            lookback,
            horizon,
            num_features,
            self.target_channels,
            int(opts.seasonal_period),
            opts.seasonality,
            None if opts.clamp is None else float(opts.clamp),
        )

    def _normalised(self, x: Tensor) -> tuple[Tensor, WindowMap]:
        """The window the MLP reads, and the map of its output back to the data's units."""
        if self.seasonal_norm is not None:
            split_leading(self.model_name, x, self.input_shape)
            x, state = self.seasonal_norm.normalise(x)
            return x, SeasonalMap(self.seasonal_norm, state)
        assert self.target_channels is not None
        x, level, scale = normalise_window(
            self.model_name, x, self.input_shape, self.window_norm, self.target_channels
        )
        return x, AffineMap(level, scale)

    def forward(self, x: Tensor) -> Tensor:
        if self.target_channels is None:
            return super().forward(x)
        x, window = self._normalised(x)
        return window.restore(super().forward(x))

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
        x, window = self._normalised(x)
        return window.restore(super().batched_forward(params, x))

    def batched_vjp(self, params: dict[str, Tensor], x: Tensor) -> tuple[Tensor, VJP] | None:
        """`batched_forward` and its backward written out (`MLP.batched_vjp` through the
        window's output map, `metadist.models.window_vjp`): what the learners' inner loop
        and the from-scratch baseline use in place of `torch.autograd.grad`.

        Args:
            params: every parameter of `named_parameters()`, each `[B, *shape]` (per task)
                or `[*shape]` (shared by all B tasks).
            x: `[B, ..., L, F]`.

        Returns:
            None where the MLP has no written-out backward (active dropout), else the
            forecast `[B, ..., H, T]` and `vjp(grad_forecast, names)`: the gradients
            `[B, *shape]` of `(forecast * grad_forecast).sum()` w.r.t. the parameters
            `names`, differentiable again under grad mode.

        Raises:
            ValueError: inputs whose trailing dims differ from `input_shape`.
        """
        if self.target_channels is None:
            return super().batched_vjp(params, x)
        x, window = self._normalised(x)
        result = super().batched_vjp(params, x)
        if result is None:
            return None
        return window_vjp(*result, window)
