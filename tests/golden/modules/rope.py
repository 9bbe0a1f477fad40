"""minicomp: generated module for `rope` on cpu.

Inputs:
    q: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1)
    k: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1)
    cos: float32[16, 64] stride (64, 1)
    sin: float32[16, 64] stride (64, 1)

ATen graph:
    q: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = input
    k: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = input
    cos: float32[16, 64] stride (64, 1) cpu = input
    sin: float32[16, 64] stride (64, 1) cpu = input
    mul: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = aten.mul.Tensor(q, cos)  # pointwise
    slice_1: float32[2, 4, 16, 32] stride (4096, 1024, 64, 1) cpu = aten.slice.Tensor(q, 3, 32, 9223372036854775807)  # view
    neg: float32[2, 4, 16, 32] stride (2048, 512, 32, 1) cpu = aten.neg.default(slice_1)  # pointwise
    slice_2: float32[2, 4, 16, 32] stride (4096, 1024, 64, 1) cpu = aten.slice.Tensor(q, 3, 0, 32)  # view
    cat: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = aten.cat.default([neg, slice_2], -1)  # view
    mul_1: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = aten.mul.Tensor(cat, sin)  # pointwise
    add: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = aten.add.Tensor(mul, mul_1)  # pointwise
    mul_2: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = aten.mul.Tensor(k, cos)  # pointwise
    slice_3: float32[2, 4, 16, 32] stride (4096, 1024, 64, 1) cpu = aten.slice.Tensor(k, 3, 32, 9223372036854775807)  # view
    neg_1: float32[2, 4, 16, 32] stride (2048, 512, 32, 1) cpu = aten.neg.default(slice_3)  # pointwise
    slice_4: float32[2, 4, 16, 32] stride (4096, 1024, 64, 1) cpu = aten.slice.Tensor(k, 3, 0, 32)  # view
    cat_1: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = aten.cat.default([neg_1, slice_4], -1)  # view
    mul_3: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = aten.mul.Tensor(cat_1, sin)  # pointwise
    add_1: float32[2, 4, 16, 64] stride (4096, 1024, 64, 1) cpu = aten.add.Tensor(mul_2, mul_3)  # pointwise
    return ['add', 'add_1']

Plan:
    kernel mc_fused_mul_slice_neg_cat_add_0  stage 0  space [2, 4, 16, 64]
        computes ['mul', 'slice_1', 'neg', 'slice_2', 'cat', 'mul_1', 'add', 'mul_2', 'slice_3', 'neg_1', 'slice_4', 'cat_1', 'mul_3', 'add_1']
        reads ['q', 'k', 'cos', 'sin']  writes ['add', 'add_1']
"""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minicomp.runtime import Launch, PointwiseLaunch


# kernel 0: mul, slice_1, neg, slice_2, cat, mul_1, add, mul_2, slice_3, neg_1, slice_4, cat_1, mul_3, add_1
#   aten ops: mul, slice, neg, cat, add
#   iteration space: [2 x 4 x 16 x 64] (dims [0, 1, 2, 3] of [2, 4, 16, 64])
#   reads q, k, cos, sin; writes add, add_1
#   dim 3 (64) walked as 2 parts of 32: each part's cat/slice choices are decided in its own lines
@triton.jit
def mc_fused_mul_slice_neg_cat_add_0(q_ptr, cos_ptr, sin_ptr, k_ptr, out0_ptr, out1_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x2 = (offsets // 32) % 16
    x3 = offsets % 32
    q = tl.load(q_ptr + (x3 + 64*(offsets // 32)), mask=mask, other=0)
    cos = tl.load(cos_ptr + (64*x2 + x3), mask=mask, other=0)
    q_1 = tl.load(q_ptr + (x3 + 64*(offsets // 32) + 32), mask=mask, other=0)
    sin = tl.load(sin_ptr + (64*x2 + x3), mask=mask, other=0)
    k = tl.load(k_ptr + (x3 + 64*(offsets // 32)), mask=mask, other=0)
    k_1 = tl.load(k_ptr + (x3 + 64*(offsets // 32) + 32), mask=mask, other=0)
    cos_1 = tl.load(cos_ptr + (64*x2 + x3 + 32), mask=mask, other=0)
    sin_1 = tl.load(sin_ptr + (64*x2 + x3 + 32), mask=mask, other=0)
    # part 0 of 2
    mul = q * cos  # aten.mul.Tensor
    neg = q_1 * -1.0  # aten.neg.default
    mul_1 = neg * sin  # aten.mul.Tensor
    add = mul + mul_1  # aten.add.Tensor
    mul_2 = k * cos  # aten.mul.Tensor
    neg_1 = k_1 * -1.0  # aten.neg.default
    mul_3 = neg_1 * sin  # aten.mul.Tensor
    add_1 = mul_2 + mul_3  # aten.add.Tensor
    # part 1 of 2
    mul_4 = q_1 * cos_1  # aten.mul.Tensor
    mul_1_1 = q * sin_1  # aten.mul.Tensor
    add_2 = mul_4 + mul_1_1  # aten.add.Tensor
    mul_2_1 = k_1 * cos_1  # aten.mul.Tensor
    mul_3_1 = k * sin_1  # aten.mul.Tensor
    add_1_1 = mul_2_1 + mul_3_1  # aten.add.Tensor
    tl.store(out0_ptr + (x3 + 64*(offsets // 32)), add, mask=mask)
    tl.store(out1_ptr + (x3 + 64*(offsets // 32)), add_1, mask=mask)
    tl.store(out0_ptr + (x3 + 64*(offsets // 32) + 32), add_2, mask=mask)
    tl.store(out1_ptr + (x3 + 64*(offsets // 32) + 32), add_1_1, mask=mask)


launch_0 = Launch(mc_fused_mul_slice_neg_cat_add_0, PointwiseLaunch(numel=4096, parts=2), device="cpu")


def call(q, k, cos, sin):
    return call_boxed([q, k, cos, sin])


def call_boxed(args):
    """AOTAutograd's boxed convention: the list is emptied, so each input dies at its last use."""
    q, k, cos, sin = args
    args.clear()
    add = torch.empty_strided((2, 4, 16, 64), (4096, 1024, 64, 1), dtype=torch.float32, device='cpu')
    add_1 = torch.empty_strided((2, 4, 16, 64), (4096, 1024, 64, 1), dtype=torch.float32, device='cpu')
    launch_0(q, cos, sin, k, add, add_1, 4096)  # mc_fused_mul_slice_neg_cat_add_0
    del cos, k, q, sin
    return (add, add_1)
