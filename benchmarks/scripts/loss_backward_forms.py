# ruff: noqa: E501
"""GPT-2's loss-backward kernel as minicomp wrote it (session 21: one-hot sum pass, int64
target compare) and variants, by RBLOCK and warps, against a copy of the same bytes.

    python benchmarks/scripts/loss_backward_forms.py      # repository root, a GPU
"""

from types import SimpleNamespace

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _sum(a, b):
    return a + b


@triton.jit
def k_gen(
    t_ptr,
    g_ptr,
    n_ptr,
    mm_ptr,
    amax_ptr,
    log_ptr,
    out_ptr,
    n_rows,
    XBLOCK: tl.constexpr,
    RBLOCK: tl.constexpr,
    PASS1: tl.constexpr,
    I32: tl.constexpr,
):
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < n_rows
    x0 = xindex
    t = tl.load(t_ptr + x0, mask=xmask, other=0)
    ne = t != -100
    w4 = tl.where(ne, t, tl.full([XBLOCK, 1], 0, tl.int64))
    if I32:
        w4 = w4.to(tl.int32)
    g = tl.broadcast_to(tl.load(g_ptr + 0), [XBLOCK, 1])
    n = tl.broadcast_to(tl.load(n_ptr + 0), [XBLOCK, 1])
    w5 = tl.where(ne, g / n, tl.full([XBLOCK, 1], 0.0, tl.float32))
    if PASS1:
        acc = tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)
        for roffset in range(0, 50257, RBLOCK):
            r0 = roffset + tl.arange(0, RBLOCK)[None, :]
            rmask = r0 < 50257
            sc = tl.where(r0 == w4, -1.0, tl.full([XBLOCK, RBLOCK], 0.0, tl.float32))
            acc = tl.where(rmask, _sum(acc, sc * w5), acc)
        s9 = tl.reduce(acc, 1, _sum)[:, None]
    else:
        s9 = -w5
    amax = tl.load(amax_ptr + x0, mask=xmask, other=0)
    lg = tl.load(log_ptr + x0, mask=xmask, other=0)
    for roffset in range(0, 50257, RBLOCK):
        r0 = roffset + tl.arange(0, RBLOCK)[None, :]
        rmask = r0 < 50257
        sc = tl.where(r0 == w4, -1.0, tl.full([XBLOCK, RBLOCK], 0.0, tl.float32))
        m23 = sc * w5
        mm = tl.load(mm_ptr + (r0 + 51470336 * (x0 // 1024) + 50264 * (x0 % 1024)), mask=xmask & rmask, other=0).to(
            tl.float32
        )
        e = tl.exp(mm - amax - lg)
        v = m23 - e * s9
        tl.store(out_ptr + (50264 * x0 + r0), v.to(tl.bfloat16), mask=xmask & rmask)


R, V, VP = 4096, 50257, 50264  # rows, the vocabulary, its padded row stride


def inputs() -> SimpleNamespace:
    """The kernel's operands at GPT-2's sizes on the GPU, its output, and the floor: the time of a
    copy of as many bytes as it reads and writes (ms)."""
    dev = "cuda"
    run = SimpleNamespace(
        t=torch.randint(0, V, (R,), device=dev),
        g=torch.ones((), device=dev),
        n=torch.full((), float(R), device=dev),
        mm=torch.randn(R, VP, device=dev, dtype=torch.bfloat16),
        amax=torch.randn(R, device=dev),
        lg=torch.randn(R, device=dev),
        out=torch.empty(R, VP, device=dev, dtype=torch.bfloat16),
    )
    run.floor = do_bench(lambda: run.out.copy_(run.mm), warmup=25, rep=200)
    print(f"copy of the same bytes (floor): {run.floor * 1e3:.1f} us")
    return run


def main() -> None:
    x, ref = inputs(), None
    for pass1, i32 in ((1, 0), (0, 0), (0, 1), (1, 1)):
        for rb in (1024, 2048, 4096):
            for nw in (4, 8, 16):
                f = lambda: k_gen[(R,)](  # noqa: E731
                    x.t, x.g, x.n, x.mm, x.amax, x.lg, x.out, R, XBLOCK=1, RBLOCK=rb, PASS1=pass1, I32=i32, num_warps=nw
                )
                f()
                torch.cuda.synchronize()
                if ref is None:
                    ref = x.out.clone()
                else:
                    assert torch.allclose(x.out[:, :V].float(), ref[:, :V].float(), atol=1e-2), (pass1, i32, rb, nw)
                ms = do_bench(f, warmup=25, rep=200)
                print(f"pass1={pass1} int32={i32} RBLOCK={rb} warps={nw}: {ms * 1e3:.1f} us  {ms / x.floor:.2f}x floor")


if __name__ == "__main__":
    main()
