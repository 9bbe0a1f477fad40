# ruff: noqa: E501
"""Elements a thread in looped reductions over [4096, 50257] bf16 rows with masked steps: the
loss-backward kernel and a two-pass softmax, by RBLOCK and warps (session 21).

    python benchmarks/scripts/loss_backward_threads.py    # repository root, a GPU
"""

import importlib.util
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

spec = importlib.util.spec_from_file_location("ce", "benchmarks/scripts/loss_backward_forms.py")


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
    sys.argv = ["x"]
    src = open("benchmarks/scripts/loss_backward_forms.py").read().split("R, V, VP =")[0]
    ns = {}
    exec(compile(src, "benchmarks/scripts/loss_backward_forms.py", "exec"), ns)
    k_gen = ns["k_gen"]
    R, V, VP = 4096, 50257, 50264
    dev = "cuda"
    t = torch.randint(0, V, (R,), device=dev)
    g = torch.ones((), device=dev)
    n = torch.full((), float(R), device=dev)
    mm = torch.randn(R, VP, device=dev, dtype=torch.bfloat16)
    amax = torch.randn(R, device=dev)
    lg = torch.randn(R, device=dev)
    out = torch.empty(R, VP, device=dev, dtype=torch.bfloat16)
    floor = do_bench(lambda: out.copy_(mm), warmup=25, rep=200)
    print(f"floor (copy) {floor * 1e3:.1f} us")
    for name in ("loss_bw", "softmax"):
        for rb in (512, 1024, 2048, 4096):
            for nw in (2, 4, 8, 16, 32):
                per = rb // (32 * nw)
                if per < 1:
                    continue
                if name == "loss_bw":
                    f = lambda: k_gen[(R,)](
                        t, g, n, mm, amax, lg, out, R, XBLOCK=1, RBLOCK=rb, PASS1=1, I32=0, num_warps=nw
                    )
                else:
                    f = lambda: softmax2[(R,)](mm, out, R, RBLOCK=rb, num_warps=nw)
                try:
                    f()
                    torch.cuda.synchronize()
                    ms = do_bench(f, warmup=25, rep=150)
                except Exception as e:
                    print(name, rb, nw, "fail", str(e)[:80])
                    continue
                print(
                    f"{name} RBLOCK={rb} warps={nw} per_thread={per}: {ms * 1e3:.1f} us {ms / floor:.2f}x", flush=True
                )
