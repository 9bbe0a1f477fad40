"""The buffers and views a generated `call` makes, by the C++ paths Inductor's wrapper uses.

    buf = empty_cuda(0, (8, 512, 768), (393216, 768, 1), torch.bfloat16)
    v = reinterpret(buf, (4096, 768), (768, 1), 0)

`torch.empty_strided(..., device="cuda:0")` parses its device and goes through the Python
argument parser: about 3 us a buffer more than `_empty_strided_cuda`, and a BERT training step
makes 130 of them. A view (`view`, `permute`, `unsqueeze` of a value whose layout the plan
knows: a guarded input or a conformed extern output) is made at the strides the plan read from
its meta kernel, without the op's shape checks. Where this torch lacks either function, the plain
ATen call does the same.
"""

from __future__ import annotations

import torch

_guards = getattr(torch._C, "_dynamo", None)
_guards = getattr(_guards, "guards", None)
_fast_empty = getattr(_guards, "_empty_strided_cuda", None)
_fast_view = getattr(_guards, "_reinterpret_tensor", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def empty_cuda(index: int, shape: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    """Uninitialized memory on CUDA device `index` (the fast path allocates on the current device)."""
    if _fast_empty is not None and _current_device() == index:
        return _fast_empty(shape, stride, dtype)
    return torch.empty_strided(shape, stride, dtype=dtype, device=torch.device("cuda", index))


def reinterpret(base: torch.Tensor, shape: tuple, stride: tuple, offset: int) -> torch.Tensor:
    """`base`'s memory seen at `shape` and `stride`, `offset` elements past `base`'s own start."""
    if _fast_view is not None:
        return _fast_view(base, shape, stride, offset)
    return base.as_strided(shape, stride, base.storage_offset() + offset)


def over_or_empty(base: torch.Tensor, shape: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A buffer of `shape` and `stride` over `base`'s memory from its storage's start, where that
    memory holds it (a donated saved value whose storage is a whole padded product); else new."""
    need = (1 + sum((n - 1) * s for n, s in zip(shape, stride))) * dtype.itemsize if all(shape) else 0
    if base.dtype == dtype and base.storage_offset() == 0 and base.untyped_storage().nbytes() >= need:
        return base.as_strided(shape, stride, 0)
    return torch.empty_strided(shape, stride, dtype=dtype, device=base.device)
