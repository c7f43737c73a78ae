"""`thin_matmul`: products with a dimension of 1 as broadcast products, equal to matmul."""

import pytest
import torch

from metadist.models.thin_matmul import is_thin, thin_matmul


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "thin"),
    [
        ((4, 7, 1), (4, 1, 5), True),  # k = 1: outer product
        ((4, 7, 3), (4, 3, 1), True),  # n = 1
        ((4, 1, 3), (4, 3, 5), True),  # m = 1
        ((4, 7, 1), (1, 5), True),  # shared right factor
        ((4, 7, 3), (3, 1), True),
        ((4, 7, 3), (4, 3, 5), False),
        ((4, 7, 3), (3, 5), False),
        # a matrix-vector product with a wide matrix: the matmul
        ((4, 1, 48), (4, 48, 48), False),
        ((4, 48, 48), (48, 1), False),
        ((4, 1, 40), (40, 40), True),  # the sinusoid's 40 x 40: still broadcast
        ((4, 48, 1), (4, 1, 48), True),  # an outer product of any size
    ],
)
def test_thin_matmul_equals_matmul_with_its_gradients(a_shape, b_shape, thin):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(*a_shape, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(*b_shape, generator=g, dtype=torch.float64, requires_grad=True)
    assert is_thin(a, b) == thin
    out, expected = thin_matmul(a, b), torch.matmul(a, b)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    weights = torch.randn(expected.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out * weights).sum(), (a, b), create_graph=True)
    want = torch.autograd.grad((expected * weights).sum(), (a, b), create_graph=True)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)


def test_autocast_keeps_the_matmul():
    a, b = torch.randn(4, 7, 1), torch.randn(4, 1, 5)
    assert is_thin(a, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not is_thin(a, b)
        assert thin_matmul(a, b).dtype == torch.bfloat16
