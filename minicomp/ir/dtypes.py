"""torch dtypes as Triton sees them, and the dtype rules of fused code.

Inside a kernel, float16 and bfloat16 values are computed in float32 (load,
upcast, compute, downcast at the store), like PyTorch's own CUDA kernels do
internally; every other dtype is computed in itself.
"""

from __future__ import annotations

import math

import torch

TRITON_DTYPE = {
    torch.bool: "tl.int1",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
}
SUPPORTED = frozenset(TRITON_DTYPE)
LOW_PRECISION = frozenset({torch.float16, torch.bfloat16})


def triton_dtype(dtype: torch.dtype) -> str:
    return TRITON_DTYPE[dtype]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value of `dtype` is held in while a kernel computes."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def short_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32: what headers and signatures print."""
    return str(dtype).removeprefix("torch.")


def literal(value, dtype: torch.dtype | None = None) -> str:
    """A Python scalar as Triton source, as a value of `dtype` when given.

    An integer meeting an integer dtype wraps around as eager's conversion does
    (`int32_tensor + 2**40` adds 0). Negative zero cannot be a Triton literal
    (Triton turns every constant equal to 0 into +0.0), so it is written as the
    bit pattern of -0.0."""
    if isinstance(value, bool) or dtype is torch.bool:
        return "1" if value else "0"
    if dtype is not None and not dtype.is_floating_point:
        if not dtype.is_signed:  # a bare literal is int32, which Triton's /, // and % refuse to meet unsigned
            return f"tl.full([], {wrap(int(value), dtype)}, {triton_dtype(dtype)})"
        return str(wrap(int(value), dtype))
    if isinstance(value, int) and dtype is None:
        return str(value)
    value = float(value)
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    if value == 0 and math.copysign(1.0, value) < 0:
        if dtype == torch.float64:
            return "tl.full([], -9223372036854775808, tl.int64).to(tl.float64, bitcast=True)"
        return "tl.full([], -2147483648, tl.int32).to(tl.float32, bitcast=True)"
    return repr(value)


def wrap(value: int, dtype: torch.dtype) -> int:
    """`value` converted to integer `dtype` with two's-complement wrap-around, as torch does."""
    info = torch.iinfo(dtype)
    span = info.max - info.min + 1
    return (value - info.min) % span + info.min


def round_to(value: float, dtype: torch.dtype) -> float:
    """A Python float rounded to `dtype` (what eager does to a scalar meeting a 16-bit tensor)."""
    return float(torch.tensor(value, dtype=torch.float64).to(dtype))
