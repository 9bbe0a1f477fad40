"""minicomp: generated module for `running_sum` on cpu.

Inputs:
    probs: bfloat16[4, 9000] stride (9000, 1)

ATen graph:
    probs: bfloat16[4, 9000] stride (9000, 1) cpu = input
    _to_copy: float32[4, 9000] stride (9000, 1) cpu = aten._to_copy.default(probs, dtype=torch.float32)  # pointwise
    cumsum: float32[4, 9000] stride (9000, 1) cpu = aten.cumsum.default(_to_copy, -1)  # scan
    return ['cumsum']

Plan:
    kernel mc_scan_cumsum_to_copy_0  stage 0  scan over [4, 9000] dim 1 (looped, 2048 a step)
        computes ['_to_copy', 'cumsum']
        reads ['probs']  writes ['cumsum']
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


# kernel 0: _to_copy, cumsum
#   aten ops: _to_copy, cumsum
#   scan (looped, 2048 a step): 4 rows of 9000 (dim 1 of [4, 9000]), combined by _sum in float32
#   reads probs; writes cumsum
@triton.jit
def mc_scan_cumsum_to_copy_0(probs_ptr, out_ptr, n_rows, XBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < n_rows
    RBLOCK: tl.constexpr = 2048
    x0 = xindex
    carry = tl.full([XBLOCK, 1], 0.0, tl.float32)
    for roffset in range(0, 9000, RBLOCK):  # pass 1: cumsum
        rindex = roffset + tl.arange(0, RBLOCK)[None, :]
        rmask = rindex < 9000
        r0 = rindex
        probs = tl.load(probs_ptr + (9000*x0 + r0), mask=xmask & rmask, other=0).to(tl.float32)
        lanes = tl.where(xmask & rmask, probs, 0.0).to(tl.float32)
        scan = tl.associative_scan(lanes, 1, _sum)
        scan_1 = _sum(carry, scan)
        carry = _sum(carry, tl.reduce(lanes, 1, _sum)[:, None])
        tl.store(out_ptr + (9000*x0 + r0), scan_1, mask=xmask & rmask)


launch_0 = Launch(mc_scan_cumsum_to_copy_0, ReductionLaunch(rows=4, rblock=2048, extent=9000), device="cpu")


def call(probs):
    return call_boxed([probs])


def call_boxed(args):
    """AOTAutograd's boxed convention: the list is emptied, so each input dies at its last use."""
    probs, = args
    args.clear()
    cumsum = torch.empty_strided((4, 9000), (9000, 1), dtype=torch.float32, device='cpu')
    launch_0(probs, cumsum, 4)  # mc_scan_cumsum_to_copy_0
    del probs
    return (cumsum,)
