"""N-BEATS (Oreshkin et al., 2020): stacks of fully connected blocks with doubly residual
backcast and forecast outputs, with generic and interpretable (trend, seasonality) bases.

Each block reads what the blocks before it left of the window (the residual), passes it
through `layers` fully connected ReLU layers of `width`, and emits expansion coefficients
for a backcast (subtracted from the residual handed to the next block) and a forecast
(added to the model's output). A generic block's coefficients are its backcast and
forecast; a trend block's multiply a polynomial basis of degree `degree`, a seasonality
block's a Fourier basis. The bases share one time axis, so the polynomial or harmonic a
block fits to the window is the one it extends over the horizon: the window's steps are
`s = −L .. −1`, the horizon's `s = 0 .. H−1`; the trend basis is the powers of `s / L`
(bounded by 1 over the window, so its coefficients stay well scaled for any lookback),
the seasonality basis the cosines and sines of `2πk·s / H`.

The last block emits no backcast (nothing reads it), and its forecast layer is `head`,
the layer ANIL adapts by default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from metadist.models._common import (
    ConfigurableModel,
    denormalise_forecast,
    normalise_window,
    numel,
    positive_int,
    split_leading,
    window_norm_options,
)
from metadist.models.registry import register_model

STACK_KINDS = ("generic", "trend", "seasonality")

Linear = Callable[[str, Tensor], Tensor]


@register_model("nbeats")
class NBeats(ConfigurableModel):
    """N-BEATS over one window `[L, F]`, forecasting `[H, T]` at once.

    Args:
        input_shape: `(L, F)` (or any example shape for generic stacks: it is flattened).
        output_shape: `(H, T)` (or any shape for generic stacks, e.g. `(N,)` to classify).
        options: `NBeats.Options` (below), or its fields as keywords.

    Shapes: `[..., L, F]` → `[..., H, T]`; `batched_forward` runs B parameter sets at once
    as batched matmuls (what the learners use for a batch of tasks).

    Raises:
        ValueError: a bad option, or a trend or seasonality stack without `(L, F)` input and
            `(H, T)` output.
    """

    @dataclass(frozen=True)
    class Options:
        """N-BEATS' options (`model.options`).

        Attributes:
            stacks: the kind of each stack, in order: "generic", "trend" or
                "seasonality" (N-BEATS-G is `[generic]`, N-BEATS-I `[trend, seasonality]`).
            blocks_per_stack: blocks in each stack.
            layers: fully connected ReLU layers in each block.
            width: units of each of those layers.
            degree: polynomial degree of the trend basis (trend stacks).
            harmonics: sine/cosine pairs of the seasonality basis, periods H/1 ..
                H/harmonics steps; null: ⌊H/2⌋ (seasonality stacks).
            window_norm: "none", "last" or "mean": each window relative to its own level
                and scale, the forecast mapped back (as the windowed MLP forecaster does).
            target_channels: with window_norm, the input feature of each target.
        """

        stacks: Sequence[str] = ("generic",)
        blocks_per_stack: int = 3
        layers: int = 2
        width: int = 256
        degree: int = 2
        harmonics: int | None = None
        window_norm: str = "none"
        target_channels: Sequence[int] | None = None

    model_name = "nbeats"

    def __init__(
        self,
        input_shape: tuple[int, ...],
        output_shape: tuple[int, ...],
        *,
        options: Options | None = None,
        **keywords: Any,
    ) -> None:
        super().__init__()
        self.options: NBeats.Options = self.read_options(keywords, options)
        opts = self.options
        name = self.model_name
        self.input_shape = tuple(input_shape)
        self.output_shape = tuple(output_shape)
        kinds = [str(kind) for kind in opts.stacks]
        if not kinds or any(kind not in STACK_KINDS for kind in kinds):
            raise ValueError(
                f"model {name!r}: stacks must be a non-empty list of {', '.join(STACK_KINDS)}, "
                f"got {list(opts.stacks)!r}"
            )
        per_stack = positive_int(name, "blocks_per_stack", opts.blocks_per_stack)
        num_layers = positive_int(name, "layers", opts.layers)
        units = positive_int(name, "width", opts.width)
        if int(opts.degree) < 0:
            raise ValueError(f"model {name!r}: degree must be >= 0, got {opts.degree!r}")
        self.kinds = [kind for kind in kinds for _ in range(per_stack)]
        self.num_layers = num_layers
        if any(kind != "generic" for kind in kinds):
            self._register_bases(int(opts.degree), opts.harmonics)
        self.window_norm, self.target_channels = window_norm_options(
            name, opts.window_norm, opts.target_channels, self.input_shape, self.output_shape
        )
        num_inputs, num_outputs = numel(self.input_shape), numel(self.output_shape)
        blocks = []
        for index, kind in enumerate(self.kinds):
            block = nn.ModuleDict()
            fc, size = [], num_inputs
            for _ in range(num_layers):
                fc.append(nn.Linear(size, units))
                size = units
            block["fc"] = nn.ModuleList(fc)
            if index < len(self.kinds) - 1:
                block["backcast"] = nn.Linear(units, self._coefficients(kind, "backcast"))
                block["forecast"] = nn.Linear(units, self._coefficients(kind, "forecast"))
            blocks.append(block)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(units, self._coefficients(self.kinds[-1], "forecast"))
        if self.kinds[-1] == "generic":
            assert self.head.out_features == num_outputs

    def _register_bases(self, degree: int, harmonics: int | None) -> None:
        """The trend and seasonality bases over the window's and the horizon's steps, as
        buffers `<kind>_backcast [P, L]` and `<kind>_forecast [P, H]`.

        Raises:
            ValueError: shapes other than `(L, F)` → `(H, T)`, or `harmonics` < 1.
        """
        name = self.model_name
        if len(self.input_shape) != 2 or len(self.output_shape) != 2:
            raise ValueError(
                f"model {name!r}: trend and seasonality stacks need input_shape (L, F) and "
                f"output_shape (H, T), got {self.input_shape!r} and {self.output_shape!r}; "
                "use stacks: [generic]"
            )
        lookback, horizon = self.input_shape[0], self.output_shape[0]
        past = torch.arange(lookback, dtype=torch.float64) - lookback
        future = torch.arange(horizon, dtype=torch.float64)
        count = horizon // 2 if harmonics is None else int(harmonics)
        if count < 1:
            if harmonics is not None:
                raise ValueError(f"model {name!r}: harmonics must be >= 1, got {harmonics!r}")
            count = 1
        for kind, basis in (
            ("trend", lambda steps: _polynomial(steps / lookback, degree)),
            ("seasonality", lambda steps: _fourier(steps / horizon, count)),
        ):
            self.register_buffer(f"{kind}_backcast", basis(past).float(), persistent=False)
            self.register_buffer(f"{kind}_forecast", basis(future).float(), persistent=False)

    def _coefficients(self, kind: str, side: str) -> int:
        """Outputs of a block's `side` layer: the values themselves (generic) or one
        coefficient per basis function and channel."""
        if kind == "generic":
            return numel(self.input_shape if side == "backcast" else self.output_shape)
        channels = self.input_shape[1] if side == "backcast" else self.output_shape[1]
        return getattr(self, f"{kind}_{side}").shape[0] * channels

    def _expand(self, kind: str, side: str, theta: Tensor) -> Tensor:
        """Block coefficients `[..., P·C]` → values `[..., steps·C]` on the basis."""
        if kind == "generic":
            return theta
        basis = getattr(self, f"{kind}_{side}").to(theta.dtype)  # [P, steps]
        values = torch.einsum("...pc,ps->...sc", theta.unflatten(-1, (basis.shape[0], -1)), basis)
        return values.flatten(-2)

    def _stack(self, x: Tensor, linear: Linear) -> Tensor:
        """The blocks over flattened windows `x [..., L·F]` → forecasts `[..., H·T]`."""
        residual, forecast = x, None
        last = len(self.kinds) - 1
        for index, kind in enumerate(self.kinds):
            hidden = residual
            for layer in range(self.num_layers):
                hidden = torch.relu(linear(f"blocks.{index}.fc.{layer}", hidden))
            out = linear("head" if index == last else f"blocks.{index}.forecast", hidden)
            piece = self._expand(kind, "forecast", out)
            forecast = piece if forecast is None else forecast + piece
            if index < last:
                backcast = self._expand(
                    kind, "backcast", linear(f"blocks.{index}.backcast", hidden)
                )
                residual = residual - backcast
        assert forecast is not None
        return forecast

    def _normalised(self, x: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if self.target_channels is None:
            return x, None, None
        return normalise_window(
            self.model_name, x, self.input_shape, self.window_norm, self.target_channels
        )

    def forward(self, x: Tensor) -> Tensor:
        leading = split_leading(self.model_name, x, self.input_shape)
        x, level, scale = self._normalised(x)

        def linear(name: str, hidden: Tensor) -> Tensor:
            return self.get_submodule(name)(hidden)

        out = self._stack(x.reshape(*leading, -1), linear).reshape(*leading, *self.output_shape)
        return out if level is None or scale is None else denormalise_forecast(out, level, scale)

    def batched_forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """`forward` under B parameter sets at once, as batched matmuls.

        Equals `torch.func.functional_call(self, {n: p[b] for n, p in params.items()},
        x[b])` for every b.

        Args:
            params: every parameter of `named_parameters()`, each `[B, *shape]`.
            x: `[B, ..., *input_shape]`.

        Returns:
            `[B, ..., *output_shape]`.
        """
        leading = split_leading(self.model_name, x, self.input_shape)
        x, level, scale = self._normalised(x)

        def linear(name: str, hidden: Tensor) -> Tensor:
            weight, bias = params[name + ".weight"], params[name + ".bias"]
            return torch.baddbmm(bias.unsqueeze(1), hidden, weight.transpose(1, 2))

        flat = x.reshape(leading[0], -1, numel(self.input_shape))
        out = self._stack(flat, linear).reshape(*leading, *self.output_shape)
        return out if level is None or scale is None else denormalise_forecast(out, level, scale)


def _polynomial(t: Tensor, degree: int) -> Tensor:
    """`[degree + 1, steps]`: t⁰ .. t^degree."""
    return torch.stack([t**power for power in range(degree + 1)])


def _fourier(t: Tensor, harmonics: int) -> Tensor:
    """`[2·harmonics + 1, steps]`: 1, cos(2πkt), sin(2πkt) for k = 1 .. harmonics."""
    rows = [torch.ones_like(t)]
    for k in range(1, harmonics + 1):
        rows += [torch.cos(2 * math.pi * k * t), torch.sin(2 * math.pi * k * t)]
    return torch.stack(rows)
