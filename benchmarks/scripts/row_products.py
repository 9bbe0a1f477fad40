"""One row @ a weight (a decoding step's projections) on the GPU: cuBLAS against plain Triton GEMV kernels
(`gemv_nk`: W [N, K] read along K; `gemv_kn`: W [K, N], split over K), weights rotated past L2, each
timed in a CUDA graph. `python benchmarks/scripts/row_products.py OUT.json`; results:
benchmarks/results/NVIDIA_H200/session16/probe/gemv_probe1.json."""

import json
import os
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def gemv_nk(x_ptr, w_ptr, y_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # y[n] = sum_k x[k] * w[n, k]; w K-contiguous ([N, K], nn.Linear's weight)
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rnw = rn % N
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        if K % BLOCK_K == 0:
            w = tl.load(w_ptr + rnw[:, None] * K + rk[None, :])
            x = tl.load(x_ptr + rk)
        else:
            w = tl.load(w_ptr + rnw[:, None] * K + rk[None, :], mask=rk[None, :] < K, other=0.0)
            x = tl.load(x_ptr + rk, mask=rk < K, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def kn_partial(x_ptr, w_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
    # (columns rn, partial[s, rn]): the sum over split s's k of x[k] * w[k, n]; w N-contiguous
    # ([K, N], Conv1D's weight); s = program_id(1)
    pid = tl.program_id(0)
    s = tl.program_id(1)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rnw = rn % N
    per: tl.constexpr = K // SPLIT
    acc = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
    for k in tl.range(s * per, s * per + per, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rk[:, None] * N + rnw[None, :])
        x = tl.load(x_ptr + rk)
        acc += w.to(tl.float32) * x.to(tl.float32)[:, None]
    return rn, tl.sum(acc, axis=0)


@triton.jit
def gemv_kn(x_ptr, w_ptr, p_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
    s = tl.program_id(1)
    rn, y = kn_partial(x_ptr, w_ptr, N, K, BLOCK_N, BLOCK_K, SPLIT)
    if SPLIT == 1:
        tl.store(p_ptr + rn, y.to(p_ptr.dtype.element_ty), mask=rn < N)
    else:
        tl.store(p_ptr + s * N + rn, y, mask=rn < N)


@triton.jit
def combine(p_ptr, y_ptr, N, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(p_ptr + s * N + rn, mask=rn < N, other=0.0)
    tl.store(y_ptr + rn, acc.to(y_ptr.dtype.element_ty), mask=rn < N)


def graph_time(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def bench_shape(name, lay, K, N, dev, dt, bw):
    """One shape: cuBLAS, then every Triton configuration; returns the shape's JSON row. Its tensors
    (the rotated weights and outputs) are freed when it returns."""
    nbytes = K * N * 2
    R = max(4, min(64, int(400e6 // nbytes)))
    ws = [torch.randn((N, K) if lay == "nk" else (K, N), device=dev, dtype=dt) / K**0.5 for _ in range(R)]
    x = torch.randn(1, K, device=dev, dtype=dt)
    ys = [torch.empty(1, N, device=dev, dtype=dt) for _ in range(R)]
    ref = x.float() @ (ws[0].float().T if lay == "nk" else ws[0].float())

    def lib():
        for w, y in zip(ws, ys):
            torch.mm(x, w.T if lay == "nk" else w, out=y)

    t = graph_time(lib) / R * 1e3
    floor = nbytes / bw * 1e6
    row = dict(shape=name, K=K, N=N, floor_us=round(floor, 2), cublas_us=round(t, 2), triton=[])
    print(f"{name:16s} K={K} N={N} floor {floor:6.2f} us  cuBLAS {t:6.2f} us", flush=True)
    if lay == "nk":
        cfgs = [
            (bn, bk, w)
            for bn in (1, 2, 4, 8, 16)
            for bk in (256, 512, 1024)
            for w in (4, 8)
            if bn * bk <= 8192 and bn * bk >= 512
        ]
    else:
        cfgs = [
            (bn, bk, w, sp)
            for bn in (32, 64, 128)
            for bk in (16, 32, 64)
            for w in (4,)
            for sp in (1, 2, 4, 8)
            if K % (sp * bk) == 0
        ]
    best = None
    for cfg in cfgs:
        try:
            if lay == "nk":
                bn, bk, w = cfg
                grid = (triton.cdiv(N, bn),)

                def tri():
                    for wt, y in zip(ws, ys):
                        gemv_nk[grid](x, wt, y, N, K, BLOCK_N=bn, BLOCK_K=bk, num_warps=w)
            else:
                bn, bk, w, sp = cfg
                part = torch.empty(sp, N, device=dev, dtype=torch.float32)
                grid = (triton.cdiv(N, bn), sp)

                def tri():
                    for wt, y in zip(ws, ys):
                        gemv_kn[grid](
                            x, wt, y if sp == 1 else part, N, K, BLOCK_N=bn, BLOCK_K=bk, SPLIT=sp, num_warps=w
                        )
                        if sp > 1:
                            combine[(triton.cdiv(N, 1024),)](part, y, N, SPLIT=sp, BLOCK=1024)

            ys[0].zero_()
            tri()
            torch.cuda.synchronize()
            err = (ys[0].float() - ref).abs().max().item()
            tt = graph_time(tri) / R * 1e3
        except Exception as e:
            print("  ", cfg, "failed", type(e).__name__, str(e)[:200])
            continue
        row["triton"].append([list(cfg), round(tt, 2), err])
        if best is None or tt < best[1]:
            best = (cfg, tt)
    print(f"   best triton {best[0]} {best[1]:6.2f} us  ({t / best[1]:.2f}x cuBLAS)", flush=True)
    top = sorted(row["triton"], key=lambda r: r[1])[:5]
    print("   top5", top, flush=True)
    return row


def main():
    dev = "cuda"
    dt = torch.bfloat16
    shapes = [
        ("llama q/o", "nk", 2048, 2048),
        ("llama k/v", "nk", 2048, 512),
        ("llama gate/up", "nk", 2048, 5632),
        ("llama down", "nk", 5632, 2048),
        ("llama head", "nk", 2048, 32000),
        ("gpt2 head", "nk", 1024, 50257),
        ("gpt2 c_attn", "kn", 1024, 3072),
        ("gpt2 attn proj", "kn", 1024, 1024),
        ("gpt2 c_fc", "kn", 1024, 4096),
        ("gpt2 mlp proj", "kn", 4096, 1024),
    ]
    bw = float(os.environ.get("BW", "4.3e12"))
    out = []
    for name, lay, K, N in shapes:
        out.append(bench_shape(name, lay, K, N, dev, dt, bw))
        torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
