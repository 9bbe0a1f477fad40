"""The memory layout of a value a kernel writes: the strides it is allocated and stored with."""

from __future__ import annotations

import torch

from minicomp.ir import Ref, TensorMeta
from minicomp.lowering.indexing import contiguous_strides


def output_strides(meta: TensorMeta) -> tuple[int, ...]:
    """Strides to allocate a materialized value with: the traced ones (eager's), unless they overlap.

    Dense results keep eager's layout; a view returned or saved for the backward
    (`q[..., :16]` of a [.., 64] tensor) keeps its strides too, as AOTAutograd's
    backward graph indexes it with them: its buffer spans the view's whole
    extent, and the kernel writes only the view's elements. A broadcast result
    (stride 0) is written densely instead: every element it repeats holds the
    same value, so a reader using stride 0 reads the right one either way. The repeated dims go
    outermost and the others keep eager's order, so the last dim stays contiguous where eager's
    is (an ATen reader may need it: SDPA's mask, expanded over batch and heads)."""
    if all(st != 0 or size <= 1 for size, st in zip(meta.shape, meta.stride)):
        return tuple(meta.stride)
    repeated = [st == 0 and size > 1 for size, st in zip(meta.shape, meta.stride)]
    order = sorted(range(meta.ndim), key=lambda d: (not repeated[d], -meta.stride[d], d))
    dense, step = [0] * meta.ndim, 1
    for d in reversed(order):
        dense[d] = step
        step *= max(meta.shape[d], 1)
    return tuple(dense) if step == meta.numel or meta.numel == 0 else tuple(contiguous_strides(meta.shape))


def extent(shape, stride) -> int:
    """Elements from a tensor's first to its last, plus one (a broadcast's repeats counted once)."""
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0


def is_dense(shape, stride) -> bool:
    """Whether `stride` lays `shape` out over exactly its elements: a permutation of the dims of a
    contiguous tensor (size-1 dims aside), no gaps, no overlap."""
    expected = 1
    for d in sorted(range(len(shape)), key=lambda d: (stride[d], shape[d])):
        if shape[d] == 1:
            continue
        if stride[d] != expected:
            return False
        expected *= shape[d]
    return True


# SDPA's attention-mask argument: its memory-efficient kernel on CUDA needs the mask's last dim
# contiguous and every other stride a multiple of 8 elements ("attn_bias is not correctly
# aligned"), as Inductor's sdpa_constraint provides (attention.cpp `preprocess_mask`)
MASK_ARGUMENTS = ("attn_bias", "attn_mask")
MASK_ALIGNMENT = 8


def attention_mask(node) -> str | None:
    """The value an ATen call takes as its attention mask (SDPA and its flash, efficient, cudnn
    and CPU kernels), or None."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None
    for i, argument in enumerate(target._schema.arguments):
        if argument.name in MASK_ARGUMENTS:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
            return value.name if isinstance(value, Ref) else None
    return None


def mask_strides(shape, stride) -> tuple[int, ...] | None:
    """Strides for an attention mask of `shape` laid out with `stride` that SDPA's kernels take:
    None when `stride` already serves (last dim contiguous, the others multiples of 8), else a
    row stride padded to 8 elements, Inductor's layout (an expanded dim stays expanded when
    the stride inside it is aligned)."""
    ndim = len(shape)
    if ndim < 2 or not all(shape):
        return None
    if (stride[-1] == 1 or shape[-1] <= 1) and all(st % MASK_ALIGNMENT == 0 for st in stride[:-1]):
        return None
    out = [0] * ndim
    out[-1], step = 1, 1
    for d in range(ndim - 2, -1, -1):
        if out[d + 1] != 0:
            step *= shape[d + 1]
        if stride[d] == 0 and out[d + 1] % MASK_ALIGNMENT == 0:
            continue  # expanded, and may stay so
        step = -(-step // MASK_ALIGNMENT) * MASK_ALIGNMENT
        out[d] = step
    return tuple(out)
