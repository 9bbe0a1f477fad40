"""minicomp: generated module for `rms_norm_forward` on cpu.

Inputs:
    x: float32[64, 64] stride (64, 1)
    w: float32[64] stride (1,)

ATen graph:
    x: float32[64, 64] stride (64, 1) cpu = input
    w: float32[64] stride (1,) cpu = input
    pow_1: float32[64, 64] stride (64, 1) cpu = aten.pow.Tensor_Scalar(x, 2)  # pointwise
    mean: float32[64, 1] stride (1, 1) cpu = aten.mean.dim(pow_1, [-1], True)  # reduction
    add: float32[64, 1] stride (1, 1) cpu = aten.add.Tensor(mean, 1e-06)  # pointwise
    rsqrt: float32[64, 1] stride (1, 1) cpu = aten.rsqrt.default(add)  # pointwise
    mul: float32[64, 64] stride (64, 1) cpu = aten.mul.Tensor(x, rsqrt)  # pointwise
    mul_1: float32[64, 64] stride (64, 1) cpu = aten.mul.Tensor(w, mul)  # pointwise
    return ['mul_1', 'x', 'w', 'rsqrt']

Plan:
    kernel mc_fused_pow_mean_add_rsqrt_mul_0  stage 0  reduction over [64, 64] dims [1] (persistent, RBLOCK 64)
        computes ['pow_1', 'mean', 'add', 'rsqrt', 'mul', 'mul_1']
        reads ['x', 'w']  writes ['rsqrt', 'mul_1']
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


# kernel 0: pow_1, mean, add, rsqrt, mul, mul_1
#   aten ops: pow, mean, add, rsqrt, mul
#   reduction (persistent, RBLOCK 64): 64 rows of 64 (dims [1] of [64, 64])
#   reads x, w; writes rsqrt, mul_1
@triton.jit
def mc_fused_pow_mean_add_rsqrt_mul_0(x_ptr, w_ptr, out0_ptr, out1_ptr, n_rows, XBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < n_rows
    RBLOCK: tl.constexpr = 64
    x0 = xindex
    rindex = tl.arange(0, RBLOCK)[None, :]
    rmask = tl.full([1, RBLOCK], True, tl.int1)
    r0 = rindex
    x = tl.load(x_ptr + (64*x0 + r0), mask=xmask & rmask, other=0)
    pow_1 = x * x  # aten.pow.Tensor_Scalar
    mean = tl.reduce(tl.where(rmask, pow_1, 0.0), 1, _sum)[:, None] / 64.0  # mean
    add = mean + 1e-06  # aten.add.Tensor
    rsqrt = libdevice.rsqrt(add)  # aten.rsqrt.default
    tl.store(out0_ptr + x0, rsqrt, mask=xmask)
    w = tl.load(w_ptr + r0, mask=rmask, other=0)
    mul = x * rsqrt  # aten.mul.Tensor
    mul_1 = w * mul  # aten.mul.Tensor
    tl.store(out1_ptr + (64*x0 + r0), mul_1, mask=xmask & rmask)


launch_0 = Launch(mc_fused_pow_mean_add_rsqrt_mul_0, ReductionLaunch(rows=64, rblock=64, extent=64), device="cpu")


def call(x, w):
    return call_boxed([x, w])


def call_boxed(args):
    """AOTAutograd's boxed convention: the list is emptied, so each input dies at its last use."""
    x, w = args
    args.clear()
    rsqrt = torch.empty_strided((64, 1), (1, 1), dtype=torch.float32, device='cpu')
    mul_1 = torch.empty_strided((64, 64), (64, 1), dtype=torch.float32, device='cpu')
    launch_0(x, w, rsqrt, mul_1, 64)  # mc_fused_pow_mean_add_rsqrt_mul_0
    return (mul_1, x, w, rsqrt)


# ---- backward ----

"""minicomp: generated module for `rms_norm_backward` on cpu.

Inputs:
    primals_1: float32[64, 64] stride (64, 1)
    primals_2: float32[64] stride (1,)
    rsqrt: float32[64, 1] stride (1, 1)
    tangents_1: float32[64, 64] stride (64, 1)

ATen graph:
    primals_1: float32[64, 64] stride (64, 1) cpu = input
    primals_2: float32[64] stride (1,) cpu = input
    rsqrt: float32[64, 1] stride (1, 1) cpu = input
    tangents_1: float32[64, 64] stride (64, 1) cpu = input
    mul_2: float32[64, 64] stride (64, 1) cpu = aten.mul.Tensor(tangents_1, primals_2)  # pointwise
    mul: float32[64, 64] stride (64, 1) cpu = aten.mul.Tensor(primals_1, rsqrt)  # pointwise
    mul_3: float32[64, 64] stride (64, 1) cpu = aten.mul.Tensor(tangents_1, mul)  # pointwise
    sum_1_chunks: float32[4, 16, 64] stride (1024, 64, 1) cpu = aten.view.default(mul_3, [4, 16, 64])  # view
    sum_1_partial: float32[4, 64] stride (64, 1) cpu = aten.sum.dim_IntList(sum_1_chunks, [1], False, dtype=torch.float32)  # reduction
    sum_1_total: float32[64] stride (1,) cpu = aten.sum.dim_IntList(sum_1_partial, [0], False, dtype=torch.float32)  # reduction
    sum_1: float32[1, 64] stride (64, 1) cpu = aten.view.default(sum_1_total, [1, 64])  # view
    view: float32[64] stride (1,) cpu = aten.view.default(sum_1, [64])  # view
    mul_4: float32[64, 64] stride (64, 1) cpu = aten.mul.Tensor(mul_2, primals_1)  # pointwise
    mul_5: float32[64, 64] stride (64, 1) cpu = aten.mul.Tensor(mul_2, rsqrt)  # pointwise
    sum_2: float32[64, 1] stride (1, 1) cpu = aten.sum.dim_IntList(mul_4, [1], True)  # reduction
    alias: float32[64, 1] stride (1, 1) cpu = aten.alias.default(rsqrt)  # view
    alias_1: float32[64, 1] stride (1, 1) cpu = aten.alias.default(alias)  # view
    pow_2: float32[64, 1] stride (1, 1) cpu = aten.pow.Tensor_Scalar(alias_1, 3)  # pointwise
    mul_6: float32[64, 1] stride (1, 1) cpu = aten.mul.Scalar(sum_2, -0.5)  # pointwise
    mul_7: float32[64, 1] stride (1, 1) cpu = aten.mul.Tensor(mul_6, pow_2)  # pointwise
    expand: float32[64, 64] stride (1, 0) cpu = aten.expand.default(mul_7, [64, 64])  # view
    div: float32[64, 64] stride (64, 1) cpu = aten.div.Scalar(expand, 64)  # pointwise
    pow_3: float32[64, 64] stride (64, 1) cpu = aten.pow.Tensor_Scalar(primals_1, 1.0)  # pointwise
    mul_8: float32[64, 64] stride (64, 1) cpu = aten.mul.Scalar(pow_3, 2.0)  # pointwise
    mul_9: float32[64, 64] stride (64, 1) cpu = aten.mul.Tensor(div, mul_8)  # pointwise
    add_1: float32[64, 64] stride (64, 1) cpu = aten.add.Tensor(mul_5, mul_9)  # pointwise
    return ['add_1', 'view']

Plan:
    kernel mc_fused_mul_view_sum_alias_pow_expand_0  stage 0  reduction over [64, 64] dims [1] (persistent, RBLOCK 64; 16 rows a program, partial column results of sum_1_partial)
        computes ['mul_2', 'mul', 'mul_3', 'sum_1_chunks', 'sum_1_partial', 'mul_4', 'mul_5', 'sum_2', 'alias', 'alias_1', 'pow_2', 'mul_6', 'mul_7', 'expand', 'div', 'pow_3', 'mul_8', 'mul_9', 'add_1']
        reads ['primals_1', 'primals_2', 'rsqrt', 'tangents_1']  writes ['sum_1_partial', 'add_1']
    kernel mc_fused_sum_view_1  stage 1  reduction over [4, 64] dims [0] (persistent, RBLOCK 4, rows contiguous)
        computes ['sum_1_total', 'sum_1', 'view']
        reads ['sum_1_partial']  writes ['view']
    not fused:
        sum_1_partial -> sum_1_total: sum_1_total combines the 4 partial results of a split reduction
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


# kernel 0: mul_2, mul, mul_3, sum_1_chunks, sum_1_partial, mul_4, mul_5, sum_2, alias, alias_1, pow_2, mul_6, mul_7, expand, div, pow_3, mul_8, mul_9, add_1
#   aten ops: mul, view, sum, alias, pow, expand, div, add
#   reduction (persistent, RBLOCK 64; 16 rows a program, partial column results of sum_1_partial): 64 rows of 64 (dims [1] of [64, 64])
#   reads primals_1, primals_2, rsqrt, tangents_1; writes sum_1_partial, add_1
@triton.jit
def mc_fused_mul_view_sum_alias_pow_expand_0(tangents_1_ptr, primals_1_ptr, rsqrt_ptr, primals_2_ptr, out0_ptr, out1_ptr, n_rows, XBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    xstart = pid * 16  # the first of this program's rows
    RBLOCK: tl.constexpr = 64
    rindex = tl.arange(0, RBLOCK)[None, :]
    rmask = tl.full([1, RBLOCK], True, tl.int1)
    r0 = rindex
    sum_1_partial_acc = tl.full([1, RBLOCK], 0.0, tl.float32)
    primals_2 = tl.load(primals_2_ptr + r0, mask=rmask, other=0)
    for xoffset in tl.range(0, 16, XBLOCK, num_stages=2):  # this program's 16 rows
        xindex = xstart + xoffset + tl.arange(0, XBLOCK)[:, None]
        xmask = (xoffset + tl.arange(0, XBLOCK)[:, None] < 16) & (xindex < n_rows)
        x0 = xindex
        rsqrt = tl.load(rsqrt_ptr + x0, mask=xmask, other=0)
        tangents_1 = tl.load(tangents_1_ptr + (64*x0 + r0), mask=xmask & rmask, other=0)
        primals_1 = tl.load(primals_1_ptr + (64*x0 + r0), mask=xmask & rmask, other=0)
        mul = primals_1 * rsqrt  # aten.mul.Tensor
        mul_3 = tangents_1 * mul  # aten.mul.Tensor
        mul_2 = tangents_1 * primals_2  # aten.mul.Tensor
        mul_4 = mul_2 * primals_1  # aten.mul.Tensor
        sum_1_partial_acc = _sum(sum_1_partial_acc, tl.reduce(tl.where(xmask & rmask, mul_3, 0.0), 0, _sum)[None, :])
        sum_2 = tl.reduce(tl.where(rmask, mul_4, 0.0), 1, _sum)[:, None]  # sum
        mul_6 = sum_2 * -0.5  # aten.mul.Scalar
        pow_2 = rsqrt * rsqrt * rsqrt  # aten.pow.Tensor_Scalar
        mul_7 = mul_6 * pow_2  # aten.mul.Tensor
        div = mul_7 / 64.0  # aten.div.Scalar
        mul_5 = mul_2 * rsqrt  # aten.mul.Tensor
        mul_8 = primals_1 * 2.0  # aten.mul.Scalar
        mul_9 = div * mul_8  # aten.mul.Tensor
        add_1 = mul_5 + mul_9  # aten.add.Tensor
        tl.store(out1_ptr + (64*x0 + r0), add_1, mask=xmask & rmask)
    sum_1_partial = sum_1_partial_acc  # sum of its rows
    tl.store(out0_ptr + pid * 64 + r0, sum_1_partial, mask=rmask)


launch_0 = Launch(mc_fused_mul_view_sum_alias_pow_expand_0, ReductionLaunch(rows=64, rblock=64, extent=64, groups=4), device="cpu")

# kernel 1: sum_1_total, sum_1, view
#   aten ops: sum, view
#   reduction (persistent, RBLOCK 4, rows contiguous): 64 rows of 4 (dims [0] of [4, 64])
#   reads sum_1_partial; writes view
@triton.jit
def mc_fused_sum_view_1(sum_1_partial_ptr, out_ptr, n_rows, XBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < n_rows
    RBLOCK: tl.constexpr = 4
    x0 = xindex
    rindex = tl.arange(0, RBLOCK)[None, :]
    rmask = tl.full([1, RBLOCK], True, tl.int1)
    r0 = rindex
    sum_1_partial = tl.load(sum_1_partial_ptr + (x0 + 64*r0), mask=xmask & rmask, other=0)
    sum_1_total = tl.reduce(tl.where(rmask, sum_1_partial, 0.0), 1, _sum)[:, None]  # sum
    tl.store(out_ptr + x0, sum_1_total, mask=xmask)


launch_1 = Launch(mc_fused_sum_view_1, ReductionLaunch(rows=64, rblock=4, extent=4), device="cpu")


def call(primals_1, primals_2, rsqrt, tangents_1):
    return call_boxed([primals_1, primals_2, rsqrt, tangents_1])


def call_boxed(args):
    """AOTAutograd's boxed convention: the list is emptied, so each input dies at its last use."""
    primals_1, primals_2, rsqrt, tangents_1 = args
    args.clear()
    sum_1_partial = torch.empty_strided((4, 64), (64, 1), dtype=torch.float32, device='cpu')
    add_1 = torch.empty_strided((64, 64), (64, 1), dtype=torch.float32, device='cpu')
    launch_0(tangents_1, primals_1, rsqrt, primals_2, sum_1_partial, add_1, 64)  # mc_fused_mul_view_sum_alias_pow_expand_0
    del primals_1, primals_2, rsqrt, tangents_1
    view = torch.empty_strided((64,), (1,), dtype=torch.float32, device='cpu')
    launch_1(sum_1_partial, view, 64)  # mc_fused_sum_view_1
    del sum_1_partial
    return (add_1, view)
