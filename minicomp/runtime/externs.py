"""An extern call's real output against the layout the plan assumed for it.

The plan takes each ATen call's output shape and strides from its meta kernel, and the kernels
after it index the real buffer with them. Meta kernels can differ from the real ones (a
convolution on a channels_last input, an FFT of a permuted input, `linalg.svd`'s `Vh`,
`native_batch_norm`'s saved statistics in eval mode), so after each extern call the generated
`call` compares the real `(shape, stride())` with the planned one, a tuple comparison, and only
when they differ calls `conform`: the value laid out as planned (a copy), or `ExternMismatch`
when its shape differs, which makes the call run eagerly (dispatch/entries.py, dynamo.py).
Every extern result something reads is checked, not only those of ops known to differ: the
comparison costs a few hundred ns. The storage offset is not compared: a kernel takes the
tensor's data pointer, which includes it.
"""

from __future__ import annotations

import torch


class ExternMismatch(RuntimeError):
    """An ATen call returned a value of another shape than its meta kernel said: the compiled
    code cannot use it, and the call runs eagerly."""


def conform(value, shape: tuple[int, ...], stride: tuple[int, ...], op: str):
    """`value` (the real output of `op`) with the planned `shape` and `stride`: itself when the
    strides differ only where they do not matter (a dim of size 1, no elements), else a copy."""
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ExternMismatch(f"the extern call {op} returned shape {got} where its meta kernel says {shape}")
    if value.numel() == 0 or all(n <= 1 or a == b for n, a, b in zip(shape, value.stride(), stride)):
        return value
    if _overlaps(shape, stride):  # copy_ detects only some overlaps (a stride of 0): it would drop elements
        raise ExternMismatch(
            f"the extern call {op} returned strides {value.stride()}, the plan's {stride} overlap and cannot hold it"
        )
    try:
        return torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device).copy_(value)
    except RuntimeError as err:  # a planned layout with overlapping elements cannot be written
        raise ExternMismatch(
            f"the extern call {op} returned strides {value.stride()}, the plan's {stride} cannot hold it"
        ) from err


def _overlaps(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """May two elements of this layout share an address? (Each dim's stride, smallest first, must
    pass the largest offset the smaller dims reach: torch 2.11's meta kernel of `rfftn` on a
    channels_last input says (14, 2, 1, 70) for [5, 2, 7, 5].)"""
    reach = 0
    for step, n in sorted((abs(st), n) for n, st in zip(shape, stride) if n > 1):
        if step <= reach:
            return True
        reach += step * (n - 1)
    return False


def aligned(value, stride: tuple[int, ...]):
    """`value` copied into `stride` (an attention mask laid out as SDPA's kernels need it)."""
    return torch.empty_strided(value.shape, stride, dtype=value.dtype, device=value.device).copy_(value)
