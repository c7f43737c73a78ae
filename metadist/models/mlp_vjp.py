"""The MLP's backpropagation written out, under B parameter sets (`MLP.batched_vjp`).

Why it exists: MAML's second-order meta-gradient differentiates the inner-loop gradient.
Taken with `torch.autograd.grad(create_graph=True)`, that gradient is a backward graph,
and the outer backward then runs the double backward of every op in it (the backward of
each batched matmul's backward, with its transposes). Written out as the layer-wise
backprop formulas, the inner gradient is an ordinary differentiable function of the
parameters, made of forward ops (batched matmuls, sums, elementwise products), so the
outer backward is one plain backward: the same mathematics, exact second order, in fewer
and cheaper nodes.

A parameter is either per task (`[B, *shape]`) or shared by all tasks (`[*shape]`: the
first inner step, where every task starts from the same parameters, or a parameter the
inner loop does not adapt). A layer whose weight is shared runs as one matmul over all
tasks' examples; only the weight gradient, which is per task by definition, is batched.

Supported: `nn.Linear` layers, the activations of `ACTIVATION_GRADS`, and dropout when it
is inactive (eval mode or rate 0). Anything else returns None, and the caller takes the
autograd path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metadist.models.thin_matmul import is_thin, thin_matmul

Params = dict[str, Tensor]
# (dL/d output [B, M, D_out], the parameter names wanted) → gradients of those names
VJP = Callable[[Tensor, Collection[str]], Params]

_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _relu_grad(grad: Tensor, pre: Tensor, out: Tensor) -> Tensor:
    # autograd's own backward of relu: the gradient where the output is > 0 (one op,
    # whose derivative w.r.t. the gradient is itself)
    return torch.ops.aten.threshold_backward(grad, out, 0)


def _tanh_grad(grad: Tensor, pre: Tensor, out: Tensor) -> Tensor:
    return grad * (1 - out * out)


def _silu_grad(grad: Tensor, pre: Tensor, out: Tensor) -> Tensor:
    sigmoid = torch.sigmoid(pre)
    return grad * (sigmoid * (1 + pre * (1 - sigmoid)))


def _gelu_grad(grad: Tensor, pre: Tensor, out: Tensor) -> Tensor:
    # exact GELU: Φ(z) + z φ(z)
    cdf = 0.5 * (1 + torch.erf(pre * _INV_SQRT_2))
    return grad * (cdf + pre * torch.exp(-0.5 * pre * pre) * _INV_SQRT_2PI)


# activation module type → (dL/d output, pre-activation, output) ↦ dL/d pre-activation
ACTIVATION_GRADS: dict[type[nn.Module], Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    nn.ReLU: _relu_grad,
    nn.Tanh: _tanh_grad,
    nn.SiLU: _silu_grad,
    nn.GELU: _gelu_grad,
}


def mlp_layers(body: nn.Sequential, head_name: str) -> list[tuple[str, nn.Module | None]] | None:
    """`(linear layer name, activation after it or None)` for `body` then the head, or
    None where a layer has no written-out backward (an unknown module, tanh-approximated
    GELU, active dropout)."""
    layers: list[tuple[str, nn.Module | None]] = []
    for index, layer in enumerate(body):
        if type(layer) is nn.Linear:
            layers.append((f"body.{index}", None))
        elif type(layer) in ACTIVATION_GRADS and layers and layers[-1][1] is None:
            if isinstance(layer, nn.GELU) and layer.approximate != "none":
                return None
            layers[-1] = (layers[-1][0], layer)
        elif isinstance(layer, nn.Dropout) and (not layer.training or layer.p == 0):
            continue
        else:
            return None
    return [*layers, (head_name, None)]


def batched_vjp(
    layers: list[tuple[str, nn.Module | None]], params: Params, x: Tensor
) -> tuple[Tensor, VJP]:
    """The MLP `layers` (from `mlp_layers`) on `x` and its written-out backward.

    Args:
        layers: `(linear name, activation or None)` in order.
        params: each layer's `.weight` (`[B, D_out, D_in]` per task or `[D_out, D_in]`
            shared) and `.bias` (`[B, D_out]` or `[D_out]`).
        x: `[B, M, D_in]`.

    Returns:
        The output `[B, M, D_out]` and `vjp(grad_output [B, M, D_out], names)` → the
        gradient of `(output * grad_output).sum()` w.r.t. each parameter in `names`
        (`[B, *shape]`, per task), built from differentiable ops: under grad mode the
        result can be differentiated again (second-order MAML) by a plain backward.
    """
    saved = []  # (layer input, pre-activation, output) of every layer
    hidden = x
    for name, act in layers:
        pre = _linear(params[name + ".weight"], params[name + ".bias"], hidden)
        out = pre if act is None else act(pre)
        saved.append((hidden, pre, out))
        hidden = out

    def vjp(grad_output: Tensor, names: Collection[str]) -> Params:
        wanted = set(names)
        first = next((i for i, (n, _) in enumerate(layers) if _layer_wanted(n, wanted)), None)
        grads: Params = {}
        if first is None:
            return grads
        grad = grad_output
        for index in range(len(layers) - 1, first - 1, -1):
            name, act = layers[index]
            layer_in, pre, out = saved[index]
            if act is not None:
                grad = ACTIVATION_GRADS[type(act)](grad, pre, out)
            if name + ".weight" in wanted:  # per task: dz^T h, [B, D_out, D_in]
                grads[name + ".weight"] = thin_matmul(grad.transpose(1, 2), layer_in)
            if name + ".bias" in wanted:
                grads[name + ".bias"] = grad.sum(1)
            if index > first:
                weight = params[name + ".weight"]
                grad = thin_matmul(grad, weight)
        return grads

    return hidden, vjp


def _layer_wanted(name: str, wanted: set[str]) -> bool:
    return name + ".weight" in wanted or name + ".bias" in wanted


def _linear(weight: Tensor, bias: Tensor, x: Tensor) -> Tensor:
    """`x [B, M, D_in]` through a weight and bias, each shared or per task."""
    per_task_bias = bias.unsqueeze(1) if bias.dim() == 2 else bias
    weight_t = weight.transpose(-1, -2)
    if is_thin(x, weight_t):
        return thin_matmul(x, weight_t) + per_task_bias
    if weight.dim() == 2:  # shared: one matmul over every task's examples
        return F.linear(x, weight, bias) if bias.dim() == 1 else F.linear(x, weight) + per_task_bias
    return torch.baddbmm(per_task_bias, x, weight_t)
