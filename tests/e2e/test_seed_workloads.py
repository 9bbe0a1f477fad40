"""Each seed workload is exactly one kernel and matches eager, in 32- and 16-bit floats."""

import pytest
import torch
import workloads as w
from conftest import aten_call, check

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(37, 65), (3, 5, 129)]  # odd sizes: masks and broadcasts must be right


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_elementwise_seeds_are_one_kernel(device, dtype, shape):
    x, y, g = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    b = torch.randn(shape[-1], device=device, dtype=dtype)
    check(w.gelu_tanh, x, b, kernels=1)
    check(w.gelu_erf, x, kernels=1)
    check(w.bias_relu, x, b, kernels=1)
    check(w.lora_epilogue, x, y, b, kernels=1)
    check(w.swiglu, g, y, kernels=1)


def test_gelu_tanh_lowering_reads_like_the_formula(device):
    x = torch.randn(8, 16, device=device)
    source = check(lambda x: torch.nn.functional.gelu(x, approximate="tanh"), x, kernels=1)
    assert "libdevice.tanh" in source  # float32: eager's exact path
    source = check(lambda x: torch.nn.functional.gelu(x, approximate="tanh"), x.bfloat16(), kernels=1)
    assert "libdevice.fast_dividef(x, 1.0 + tl.exp(-2.0 * " in source  # 16-bit: test_fast_math.py


def test_matmul_between_pointwise_parts(device):
    def mlp(x, w, b):
        h = torch.relu(x * 2.0 + 1.0)
        return torch.sigmoid(h @ w + b) * 3.0

    x, wt, b = torch.randn(6, 4, device=device), torch.randn(4, 5, device=device), torch.randn(5, device=device)
    source = check(mlp, x, wt, b, kernels=2)
    assert aten_call(source, "mm.default")
