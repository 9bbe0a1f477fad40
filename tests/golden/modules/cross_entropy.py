"""minicomp: generated module for `cross_entropy` on cpu.

Inputs:
    logits: float32[4, 9000] stride (9000, 1)
    target: int64[4] stride (1,)

ATen graph:
    logits: float32[4, 9000] stride (9000, 1) cpu = input
    target: int64[4] stride (1,) cpu = input
    amax: float32[4, 1] stride (1, 1) cpu = aten.amax.default(logits, [1], True)  # reduction
    sub: float32[4, 9000] stride (9000, 1) cpu = aten.sub.Tensor(logits, amax)  # pointwise
    exp: float32[4, 9000] stride (9000, 1) cpu = aten.exp.default(sub)  # pointwise
    sum_1: float32[4, 1] stride (1, 1) cpu = aten.sum.dim_IntList(exp, [1], True)  # reduction
    log: float32[4, 1] stride (1, 1) cpu = aten.log.default(sum_1)  # pointwise
    sub_1: float32[4, 9000] stride (9000, 1) cpu = aten.sub.Tensor(sub, log)  # pointwise
    ne: bool[4] stride (1,) cpu = aten.ne.Scalar(target, -100)  # pointwise
    scalar_tensor: int64[] stride () cpu = aten.scalar_tensor.default(0, dtype=torch.int64, layout=torch.strided, device=device(type='cpu'))  # pointwise
    where: int64[4] stride (1,) cpu = aten.where.self(ne, target, scalar_tensor)  # pointwise
    unsqueeze: int64[4, 1] stride (1, 1) cpu = aten.unsqueeze.default(where, 1)  # view
    gather: float32[4, 1] stride (1, 1) cpu = aten.gather.default(sub_1, 1, unsqueeze)  # view
    squeeze: float32[4] stride (1,) cpu = aten.squeeze.dims(gather, [1])  # view
    neg: float32[4] stride (1,) cpu = aten.neg.default(squeeze)  # pointwise
    scalar_tensor_1: float32[] stride () cpu = aten.scalar_tensor.default(0, dtype=torch.float32, layout=torch.strided, device=device(type='cpu'))  # pointwise
    where_1: float32[4] stride (1,) cpu = aten.where.self(ne, neg, scalar_tensor_1)  # pointwise
    sum_2: int64[] stride () cpu = aten.sum.dim_IntList(ne, [])  # reduction
    _to_copy: float32[] stride () cpu = aten._to_copy.default(sum_2, dtype=torch.float32, device=device(type='cpu'))  # pointwise
    sum_3: float32[] stride () cpu = aten.sum.dim_IntList(where_1, [])  # reduction
    div: float32[] stride () cpu = aten.div.Tensor(sum_3, _to_copy)  # pointwise
    return ['div']

Plan:
    kernel mc_fused_amax_sub_exp_sum_log_ne_0  stage 0  reduction over [4, 9000] dims [1] (looped, 4096 a step)
        computes ['amax', 'sub', 'exp', 'sum_1', 'log', 'sub_1', 'ne', 'scalar_tensor', 'where', 'unsqueeze', 'gather', 'squeeze', 'neg', 'scalar_tensor_1', 'where_1']
        reads ['logits', 'target']  writes ['where_1']
    kernel mc_fused_ne_sum_to_copy_div_1  stage 1  reduction over [4] dims [0] (persistent, RBLOCK 4)
        computes ['ne', 'sum_2', '_to_copy', 'sum_3', 'div']
        reads ['target', 'where_1']  writes ['div']
    not fused:
        where_1 -> sum_3: sum_3 reduces a reduction over [4, 9000] reduced over dims [1] and sum_3 is one over [4] reduced over dims [0]
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


# kernel 0: amax, sub, exp, sum_1, log, sub_1, ne, scalar_tensor, where, unsqueeze, gather, squeeze, neg, scalar_tensor_1, where_1
#   aten ops: amax, sub, exp, sum, log, ne, scalar_tensor, where, unsqueeze, gather, squeeze, neg
#   reduction (looped, 4096 a step): 4 rows of 9000 (dims [1] of [4, 9000]); online max-and-sum for sum_1
#   reads logits, target; writes where_1
@triton.jit
def mc_fused_amax_sub_exp_sum_log_ne_0(logits_ptr, target_ptr, out_ptr, n_rows, XBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < n_rows
    RBLOCK: tl.constexpr = 4096
    x0 = xindex
    amax_acc = tl.full([XBLOCK, 1], float("-inf"), tl.float32)
    sum_1_acc = tl.full([XBLOCK, 1], 0.0, tl.float32)
    for roffset in range(0, 9000, RBLOCK):  # pass 1: amax, sum_1
        rindex = roffset + tl.arange(0, RBLOCK)[None, :]
        rmask = rindex < 9000
        r0 = rindex
        logits = tl.load(logits_ptr + (9000*x0 + r0), mask=xmask & rmask, other=float("-inf"))
        amax_next = _max_nan(amax_acc, tl.reduce(logits, 1, _max_nan)[:, None])
        sum_1_acc = sum_1_acc * _exp_shift(amax_acc, amax_next) + tl.reduce(_exp_shift(logits, amax_next), 1, _sum)[:, None]
        amax_acc = amax_next
    amax = amax_acc  # amax
    sum_1 = tl.where(amax == float("-inf"), float("nan"), sum_1_acc)  # sum of exp(logits - amax), accumulated online
    target = tl.load(target_ptr + x0, mask=xmask, other=0)
    ne = target != -100  # aten.ne.Scalar
    scalar_tensor = tl.full([XBLOCK, 1], 0, tl.int64)  # aten.scalar_tensor.default
    where = tl.where(ne, target, scalar_tensor)  # aten.where.self
    gather_check = tl.device_assert((where >= 0) & (where < 9000), "minicomp check: index out of bounds for dimension 1 (gather, cross_entropy's target)", mask=xmask)
    gather_tmp = where.to(tl.int32)
    gather_tmp_1 = (gather_tmp >= 0) & (gather_tmp < 9000)
    logits_1 = tl.load(logits_ptr + (9000*x0 + gather_tmp), mask=xmask & gather_tmp_1, other=0)
    sub = logits_1 - amax  # aten.sub.Tensor
    log = tl.log(sum_1)  # aten.log.default
    sub_1 = sub - log  # aten.sub.Tensor
    neg = sub_1 * -1.0  # aten.neg.default
    scalar_tensor_1 = tl.full([XBLOCK, 1], 0.0, tl.float32)  # aten.scalar_tensor.default
    where_1 = tl.where(ne, neg, scalar_tensor_1)  # aten.where.self
    tl.store(out_ptr + x0, where_1, mask=xmask)


launch_0 = Launch(mc_fused_amax_sub_exp_sum_log_ne_0, ReductionLaunch(rows=4, rblock=4096, extent=9000), device="cpu")

# kernel 1: ne, sum_2, _to_copy, sum_3, div
#   aten ops: ne, sum, _to_copy, div
#   reduction (persistent, RBLOCK 4): 1 row of 4 (dims [0] of [4])
#   reads target, where_1; writes div
@triton.jit
def mc_fused_ne_sum_to_copy_div_1(target_ptr, where_1_ptr, out_ptr, n_rows, XBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < n_rows
    RBLOCK: tl.constexpr = 4
    rindex = tl.arange(0, RBLOCK)[None, :]
    rmask = tl.full([1, RBLOCK], True, tl.int1)
    r0 = rindex
    target = tl.load(target_ptr + r0, mask=rmask, other=0)
    ne = target != -100  # aten.ne.Scalar
    where_1 = tl.load(where_1_ptr + r0, mask=rmask, other=0)
    sum_2 = tl.reduce(tl.where(rmask, ne.to(tl.int64), 0), 1, _sum)[:, None]  # sum
    sum_3 = tl.reduce(tl.where(rmask, where_1, 0.0), 1, _sum)[:, None]  # sum
    _to_copy = sum_2.to(tl.float32)  # aten._to_copy.default
    div = sum_3 / _to_copy  # aten.div.Tensor
    tl.store(out_ptr + xindex * 0, div, mask=xmask)


launch_1 = Launch(mc_fused_ne_sum_to_copy_div_1, ReductionLaunch(rows=1, rblock=4, extent=4), device="cpu")


def call(logits, target):
    return call_boxed([logits, target])


def call_boxed(args):
    """AOTAutograd's boxed convention: the list is emptied, so each input dies at its last use."""
    logits, target = args
    args.clear()
    where_1 = torch.empty_strided((4,), (1,), dtype=torch.float32, device='cpu')
    launch_0(logits, target, where_1, 4)  # mc_fused_amax_sub_exp_sum_log_ne_0
    del logits
    div = torch.empty_strided((), (), dtype=torch.float32, device='cpu')
    launch_1(target, where_1, div, 1)  # mc_fused_ne_sum_to_copy_div_1
    del target, where_1
    return (div,)
