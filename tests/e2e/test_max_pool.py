"""Max pooling decomposed into one fused kernel with one-byte window offsets (capture/max_pool.py):
the values and int64 indices of eager's op, in every layout, and what a training step saves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import check, grads_match, kernel_count

from minicomp.capture.max_pool import max_pool2d_with_indices

CASES = [  # shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 3, 9, 9), 3, 2, 1, 1, False),  # ResNet's stem pool
    ((2, 3, 10, 7), 3, 2, 1, 1, True),
    ((2, 3, 8, 8), 2, 2, 0, 1, False),
    ((1, 2, 11, 11), 3, 1, 1, 2, False),
    ((3, 9, 9), 3, 2, 1, 1, False),  # no batch dim
    ((2, 3, 7, 9), (2, 3), (1, 2), (1, 1), 1, True),
]


def _awkward(shape, channels_last: bool) -> torch.Tensor:
    """Random values with a -inf, a NaN and a block of ties, in the layout asked for."""
    x = torch.randn(shape)
    x[..., 0, 0] = float("-inf")
    x.view(-1)[5] = float("nan")
    x[..., 3:5, 3:5] = 1.0
    return x.to(memory_format=torch.channels_last) if channels_last and x.ndim == 4 else x


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_the_decomposition_is_eagers_op(case, channels_last):
    shape, *params = case
    x = _awkward(shape, channels_last)
    values, indices = torch.ops.aten.max_pool2d_with_indices(x, *params)
    mine, positions = max_pool2d_with_indices(x, *params)
    assert torch.equal(values.nan_to_num(), mine.nan_to_num()) and torch.equal(indices, positions)
    assert mine.stride() == values.stride()


def test_a_window_of_minus_infinity_points_inside_x():
    # every value -inf: each window points at its first element inside x, not into the padding
    x = torch.full((1, 1, 4, 4), float("-inf"))
    assert torch.equal(max_pool2d_with_indices(x, 3, 2, 1)[1], torch.ops.aten.max_pool2d_with_indices(x, 3, 2, 1)[1])


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", CASES[:4])
def test_compiled_values_and_indices(case, channels_last, device):
    shape, kernel, stride, padding, dilation, ceil_mode = case
    x = _awkward(shape, channels_last).to(device)

    def pool(x):
        return F.max_pool2d(torch.relu(x), kernel, stride, padding, dilation, ceil_mode, return_indices=True)

    source = check(pool, x)
    assert "max_pool2d_with_indices.default" not in source and kernel_count(source) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_saves_one_byte_a_window(dtype, device):
    # the forward saves the int8 offsets; the backward recomputes the int64 indices from them
    x = torch.randn(2, 4, 9, 9, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    entry = grads_match(lambda x: F.max_pool2d(torch.relu(x), 3, 2, 1), x)
    saved = entry.forward.source.split("return (")[-1]
    assert "max_pool2d_with_indices.default" not in entry.forward.source
    assert "dtype=torch.int8" in entry.forward.source and "int64" not in saved


def test_a_large_window_stays_atens():
    # 7 x 7 = 49 loads a value: ATen's kernel
    x = torch.randn(1, 2, 14, 14)
    assert "max_pool2d_with_indices.default" in check(lambda x: F.max_pool2d(x, 7, 7, return_indices=True), x)


def test_through_the_backend():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
    x = torch.randn(2, 3, 12, 12)
    compiled = torch.compile(model, backend="minicomp")
    compiled(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for mine, eager in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(mine, eager)
