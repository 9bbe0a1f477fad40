# ruff: noqa: E501
"""Elements a thread in looped reductions over [4096, 50257] bf16 rows with masked steps: the
loss-backward kernel and a two-pass softmax, by RBLOCK and warps (session 21).

    PYTHONPATH=. python benchmarks/scripts/loss_backward_threads.py    # repository root, a GPU
"""

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from benchmarks.scripts.loss_backward_forms import R, inputs, k_gen


@triton.jit
def softmax2(x_ptr, out_ptr, n_rows, RBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    x0 = pid + tl.arange(0, 1)[:, None]
    m = tl.full([1, RBLOCK], float("-inf"), tl.float32)
    s = tl.full([1, RBLOCK], 0.0, tl.float32)
    for roffset in range(0, 50257, RBLOCK):
        r0 = roffset + tl.arange(0, RBLOCK)[None, :]
        v = tl.load(x_ptr + 50264 * x0 + r0, mask=r0 < 50257, other=float("-inf")).to(tl.float32)
        mn = tl.maximum(m, v)
        s = tl.where(mn == float("-inf"), 0.0, s * tl.exp(m - mn) + tl.exp(v - mn))
        m = mn
    mr = tl.max(m, 1)[:, None]
    sr = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - mr)), 1)[:, None]
    for roffset in range(0, 50257, RBLOCK):
        r0 = roffset + tl.arange(0, RBLOCK)[None, :]
        v = tl.load(x_ptr + 50264 * x0 + r0, mask=r0 < 50257, other=0).to(tl.float32)
        tl.store(out_ptr + 50264 * x0 + r0, (tl.exp(v - mr) / sr).to(tl.bfloat16), mask=r0 < 50257)


if __name__ == "__main__":
    x = inputs()
    for name in ("loss_bw", "softmax"):
        for rb in (512, 1024, 2048, 4096):
            for nw in (2, 4, 8, 16, 32):
                per = rb // (32 * nw)
                if per < 1:
                    continue
                if name == "loss_bw":
                    f = lambda: k_gen[(R,)](  # noqa: E731
                        x.t, x.g, x.n, x.mm, x.amax, x.lg, x.out, R, XBLOCK=1, RBLOCK=rb, PASS1=1, I32=0, num_warps=nw
                    )
                else:
                    f = lambda: softmax2[(R,)](x.mm, x.out, R, RBLOCK=rb, num_warps=nw)  # noqa: E731
                try:
                    f()
                    torch.cuda.synchronize()
                    ms = do_bench(f, warmup=25, rep=150)
                except Exception as e:  # noqa: BLE001 - a configuration that does not compile is reported
                    print(name, rb, nw, "fail", str(e)[:80])
                    continue
                print(f"{name} RBLOCK={rb} warps={nw} per_thread={per}: {ms * 1e3:.1f} us {ms / x.floor:.2f}x")
