"""minicomp: generated module for `add_rms_norm` on cpu.

Inputs:
    x: float32[8, 64] stride (64, 1)
    r: float32[8, 64] stride (64, 1)
    w: float32[64] stride (1,)

ATen graph:
    x: float32[8, 64] stride (64, 1) cpu = input
    r: float32[8, 64] stride (64, 1) cpu = input
    w: float32[64] stride (1,) cpu = input
    add: float32[8, 64] stride (64, 1) cpu = aten.add.Tensor(x, r)  # pointwise
    pow_1: float32[8, 64] stride (64, 1) cpu = aten.pow.Tensor_Scalar(add, 2)  # pointwise
    mean: float32[8, 1] stride (1, 1) cpu = aten.mean.dim(pow_1, [-1], True)  # reduction
    add_1: float32[8, 1] stride (1, 1) cpu = aten.add.Tensor(mean, 1e-06)  # pointwise
    rsqrt: float32[8, 1] stride (1, 1) cpu = aten.rsqrt.default(add_1)  # pointwise
    mul: float32[8, 64] stride (64, 1) cpu = aten.mul.Tensor(add, rsqrt)  # pointwise
    mul_1: float32[8, 64] stride (64, 1) cpu = aten.mul.Tensor(w, mul)  # pointwise
    return ['add', 'mul_1']

Plan:
    kernel mc_fused_add_pow_mean_rsqrt_mul_0  stage 0  reduction over [8, 64] dims [1] (persistent, RBLOCK 64)
        computes ['add', 'pow_1', 'mean', 'add_1', 'rsqrt', 'mul', 'mul_1']
        reads ['x', 'r', 'w']  writes ['mul_1', 'add']
"""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from minicomp.runtime import Launch, ReductionLaunch


# -- how reductions combine two partial results (lowering/ops/reductions.py) -----------
@triton.jit
def _sum(a, b):
    return a + b


@triton.jit
def _prod(a, b):
    return a * b


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min(a, b):
    return tl.minimum(a, b)


@triton.jit
def _max_nan(a, b):  # NaN wins, as in eager's amax
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _logaddexp(a, b):  # log(exp(a) + exp(b)) without overflow; equal infinities give themselves (eager's logcumsumexp)
    lo = tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    hi = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    return tl.where((lo != hi) | (tl.abs(lo) != float("inf")), hi + libdevice.log1p(tl.exp(lo - hi)), a)


@triton.jit
def _exp_shift(x, m):  # exp(x - m) for x <= m, a row's running max; 0 where x is -inf, m too (no element yet).
    # exp2 without the fix-up for results under 2**-126, flushed to 0 (tl.exp keeps them): the sums of
    # online softmax hold exp(m - m) = 1, so they lose such terms anyway. The select is on the row's m.
    return tl.math.exp2((x - tl.where(m == float("-inf"), 0.0, m)) * 1.4426950408889634)


@triton.jit
def _argmax(a, i, b, j):  # the larger value; on a tie the first position
    take = (a > b) | ((a == b) & (i < j))
    return tl.where(take, a, b), tl.where(take, i, j)


@triton.jit
def _argmin(a, i, b, j):
    take = (a < b) | ((a == b) & (i < j))
    return tl.where(take, a, b), tl.where(take, i, j)


@triton.jit
def _argmax_nan(a, i, b, j):  # NaN counts as the largest value, as in eager's argmax
    a_nan, b_nan = a != a, b != b
    take = (a_nan & ~b_nan) | (~b_nan & (a > b)) | (((a == b) | (a_nan & b_nan)) & (i < j))
    return tl.where(take, a, b), tl.where(take, i, j)


@triton.jit
def _argmin_nan(a, i, b, j):
    a_nan, b_nan = a != a, b != b
    take = (a_nan & ~b_nan) | (~b_nan & (a < b)) | (((a == b) | (a_nan & b_nan)) & (i < j))
    return tl.where(take, a, b), tl.where(take, i, j)


# kernel 0: add, pow_1, mean, add_1, rsqrt, mul, mul_1
#   aten ops: add, pow, mean, rsqrt, mul
#   reduction (persistent, RBLOCK 64): 8 rows of 64 (dims [1] of [8, 64])
#   reads x, r, w; writes mul_1, add
@triton.jit
def mc_fused_add_pow_mean_rsqrt_mul_0(x_ptr, r_ptr, w_ptr, out0_ptr, out1_ptr, n_rows, XBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < n_rows
    RBLOCK: tl.constexpr = 64
    x0 = xindex
    rindex = tl.arange(0, RBLOCK)[None, :]
    rmask = tl.full([1, RBLOCK], True, tl.int1)
    r0 = rindex
    x = tl.load(x_ptr + (64*x0 + r0), mask=xmask & rmask, other=0)
    r = tl.load(r_ptr + (64*x0 + r0), mask=xmask & rmask, other=0)
    add = x + r  # aten.add.Tensor
    pow_1 = add * add  # aten.pow.Tensor_Scalar
    tl.store(out1_ptr + (64*x0 + r0), add, mask=xmask & rmask)
    mean = tl.reduce(tl.where(rmask, pow_1, 0.0), 1, _sum)[:, None] / 64.0  # mean
    add_1 = mean + 1e-06  # aten.add.Tensor
    rsqrt = libdevice.rsqrt(add_1)  # aten.rsqrt.default
    w = tl.load(w_ptr + r0, mask=rmask, other=0)
    mul = add * rsqrt  # aten.mul.Tensor
    mul_1 = w * mul  # aten.mul.Tensor
    tl.store(out0_ptr + (64*x0 + r0), mul_1, mask=xmask & rmask)


launch_0 = Launch(mc_fused_add_pow_mean_rsqrt_mul_0, ReductionLaunch(rows=8, rblock=64, extent=64), device="cpu")


def call(x, r, w):
    return call_boxed([x, r, w])


def call_boxed(args):
    """AOTAutograd's boxed convention: the list is emptied, so each input dies at its last use."""
    x, r, w = args
    args.clear()
    mul_1 = torch.empty_strided((8, 64), (64, 1), dtype=torch.float32, device='cpu')
    add = torch.empty_strided((8, 64), (64, 1), dtype=torch.float32, device='cpu')
    launch_0(x, r, w, mul_1, add, 8)  # mc_fused_add_pow_mean_rsqrt_mul_0
    del r, w, x
    return (add, mul_1)
