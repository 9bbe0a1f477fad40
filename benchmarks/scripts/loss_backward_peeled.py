# ruff: noqa: E501
"""The loss-backward kernel's pass with its whole steps unmasked and the last one masked
(peeled), against every step masked, by RBLOCK and warps (session 21).

    PYTHONPATH=. python benchmarks/scripts/loss_backward_peeled.py     # repository root, a GPU
"""

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from benchmarks.scripts.loss_backward_forms import R, V, inputs


@triton.jit
def k(t_ptr, mm_ptr, amax_ptr, log_ptr, out_ptr, w5c, RBLOCK: tl.constexpr, PEEL: tl.constexpr):
    x0 = tl.program_id(0) + tl.arange(0, 1)[:, None]
    t = tl.load(t_ptr + x0)
    w5 = tl.full([1, 1], w5c, tl.float32)
    s9 = -w5
    amax = tl.load(amax_ptr + x0)
    lg = tl.load(log_ptr + x0)
    if PEEL:
        FULL: tl.constexpr = (50257 // RBLOCK) * RBLOCK
        for roffset in range(0, FULL, RBLOCK):
            r0 = roffset + tl.arange(0, RBLOCK)[None, :]
            sc = tl.where(r0 == t, -1.0, 0.0)
            mm = tl.load(mm_ptr + (r0 + 50264 * x0)).to(tl.float32)
            v = sc * w5 - tl.exp(mm - amax - lg) * s9
            tl.store(out_ptr + (50264 * x0 + r0), v.to(tl.bfloat16))
        r0 = FULL + tl.arange(0, RBLOCK)[None, :]
        rmask = r0 < 50257
        sc = tl.where(r0 == t, -1.0, 0.0)
        mm = tl.load(mm_ptr + (r0 + 50264 * x0), mask=rmask, other=0).to(tl.float32)
        v = sc * w5 - tl.exp(mm - amax - lg) * s9
        tl.store(out_ptr + (50264 * x0 + r0), v.to(tl.bfloat16), mask=rmask)
    else:
        for roffset in range(0, 50257, RBLOCK):
            r0 = roffset + tl.arange(0, RBLOCK)[None, :]
            rmask = r0 < 50257
            sc = tl.where(r0 == t, -1.0, 0.0)
            mm = tl.load(mm_ptr + (r0 + 50264 * x0), mask=rmask, other=0).to(tl.float32)
            v = sc * w5 - tl.exp(mm - amax - lg) * s9
            tl.store(out_ptr + (50264 * x0 + r0), v.to(tl.bfloat16), mask=rmask)


if __name__ == "__main__":
    x, ref = inputs(), None
    for peel in (0, 1):
        for rb in (1024, 2048, 4096):
            for nw in (4, 8, 16, 32):
                f = lambda: k[(R,)](x.t, x.mm, x.amax, x.lg, x.out, 1.0 / R, RBLOCK=rb, PEEL=peel, num_warps=nw)  # noqa: E731
                f()
                torch.cuda.synchronize()
                ref = x.out.clone() if ref is None else ref
                assert torch.equal(x.out[:, :V], ref[:, :V])
                ms = do_bench(f, warmup=25, rep=150)
                print(
                    f"peel={peel} RBLOCK={rb} warps={nw} per_thread={rb // (32 * nw)}: {ms * 1e3:.1f} us {ms / x.floor:.2f}x"
                )
