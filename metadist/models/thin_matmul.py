"""Matrix products with a dimension of 1, as broadcast products.

On the CPU a batched GEMM pays a fixed price per matrix whatever its size: `[25, 40, 10]
@ [25, 10, 1]` takes about as long as `[25, 40, 10] @ [25, 10, 40]` (15-20 µs, one
thread), and so does its backward (two more such products). When the shared dimension is
1 the product is an outer product (one broadcast multiply); when a result dimension is 1
it is a multiply and a sum. Those are elementwise kernels of the same size, several times
faster, and so are their backwards. The sinusoid MLP (1-40-40-1) has such a product in
its first and last layers, in the forward, the inner gradient and the outer backward.

A matrix-vector product (`m` or `n` is 1) as a broadcast product writes and reads a
temporary of the matrix's size, so it pays only for small matrices: up to
`MAX_BROADCAST_MATRIX` elements (the sinusoid's 40 x 40). A wider one, e.g. one query
window through the competition forecaster's 256 x 256 layers, is 1.7-4.7x faster as a
matmul (one thread); an outer product (`k` is 1) is its result either way.
"""

from __future__ import annotations

import torch
from torch import Tensor

# the largest matrix (elements, per batch entry) a matrix-vector product multiplies as a
# broadcast product
MAX_BROADCAST_MATRIX = 2048


def thin_matmul(a: Tensor, b: Tensor) -> Tensor:
    """`a [..., m, k] @ b [..., k, n]` (batch dims broadcast, either may be absent), as a
    broadcast product where `k`, `n` or `m` is 1 (and `is_thin`), else `torch.matmul`."""
    if not is_thin(a, b):
        return torch.matmul(a, b)
    if a.shape[-1] == 1:  # outer product
        return a * b
    if b.shape[-1] == 1:
        return (a * b.transpose(-1, -2)).sum(-1, keepdim=True)
    return (a.transpose(-1, -2) * b).sum(-2, keepdim=True)


def is_thin(a: Tensor, b: Tensor) -> bool:
    """Whether `a @ b` should run as `thin_matmul`'s broadcast product: a dimension is 1
    (for a matrix-vector product, of a matrix of at most `MAX_BROADCAST_MATRIX` elements),
    and autocast is off (under autocast a matmul runs in the lower precision, as the
    user asked, and a broadcast product would not)."""
    if torch.is_autocast_enabled(a.device.type):
        return False
    if a.shape[-1] == 1:
        return True
    if b.shape[-1] == 1:
        return a.shape[-2] * a.shape[-1] <= MAX_BROADCAST_MATRIX
    return a.shape[-2] == 1 and b.shape[-2] * b.shape[-1] <= MAX_BROADCAST_MATRIX
