"""One-row products, other forms (beside row_products.py): the template's generic [BM, BK] x [BK, BN]
form at any strides (M = 1 and 4), and for a weight read along N a split over K whose last program
of a column block sums the partials (one launch). `python benchmarks/scripts/row_products_forms.py
OUT.json`; results: benchmarks/results/NVIDIA_H200/session16/probe/gemv_probe2.json."""

import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
from row_products import graph_time, kn_partial  # noqa: E402


@triton.jit
def gemv_generic(
    a_ptr,
    b_ptr,
    c_ptr,
    M: tl.constexpr,
    N,
    K: tl.constexpr,
    sam,
    sak,
    sbk,
    sbn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SUM_EACH: tl.constexpr,
):
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rn = pid * BN + tl.arange(0, BN)
    ram = rm % M
    rbn = rn % N
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + ram[:, None] * sam + rk[None, :] * sak
    b_ptrs = b_ptr + rk[:, None] * sbk + rbn[None, :] * sbn
    if SUM_EACH:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    else:
        acc3 = tl.zeros([BM, BK, BN], dtype=tl.float32)
    for k in tl.range(0, K, BK):
        if K % BK == 0:
            a = tl.load(a_ptrs).to(tl.float32)
            b = tl.load(b_ptrs).to(tl.float32)
        else:
            a = tl.load(a_ptrs, mask=rk[None, :] < K - k, other=0.0).to(tl.float32)
            b = tl.load(b_ptrs, mask=rk[:, None] < K - k, other=0.0).to(tl.float32)
        if SUM_EACH:
            acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)
        else:
            acc3 += a[:, :, None] * b[None, :, :]
        a_ptrs += BK * sak
        b_ptrs += BK * sbk
    if not SUM_EACH:
        acc = tl.sum(acc3, axis=1)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gemv_kn_fixup(
    x_ptr,
    w_ptr,
    p_ptr,
    cnt_ptr,
    y_ptr,
    N,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
):
    pid = tl.program_id(0)
    s = tl.program_id(1)
    rn, y = kn_partial(x_ptr, w_ptr, N, K, BLOCK_N, BLOCK_K, SPLIT)
    tl.store(p_ptr + s * N + rn, y, mask=rn < N)
    done = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel")
    if done == SPLIT - 1:
        tot = tl.zeros([BLOCK_N], dtype=tl.float32)
        for t in tl.static_range(SPLIT):
            tot += tl.load(p_ptr + t * N + rn, mask=rn < N, other=0.0, cache_modifier=".cg")
        tl.store(y_ptr + rn, tot.to(y_ptr.dtype.element_ty), mask=rn < N)
        tl.store(cnt_ptr + pid, 0)


def bench_shape(lay, name, K, N, dev, dt, out):
    """One shape at M = 1 and 4: cuBLAS, then every configuration; appends a JSON row per M to `out`.
    Its tensors (the rotated weights and outputs) are freed when it returns."""
    nbytes = K * N * 2
    R = max(4, min(64, int(400e6 // nbytes)))
    ws = [torch.randn((N, K) if lay == "nk" else (K, N), device=dev, dtype=dt) / K**0.5 for _ in range(R)]
    bs = [w.T if lay == "nk" else w for w in ws]
    for M in (1, 4):
        x = torch.randn(M, K, device=dev, dtype=dt)
        ys = [torch.empty(M, N, device=dev, dtype=dt) for _ in range(R)]
        ref = x.float() @ bs[0].float()

        def lib():
            for b, y in zip(bs, ys):
                torch.mm(x, b, out=y)

        tl_ = graph_time(lib) / R * 1e3
        res = []
        if lay == "nk":
            cfgs = [("gen", bn, bk, w, se) for bn in (1, 2, 4) for bk in (512, 1024) for w in (4, 8) for se in (0, 1)]
        else:
            cfgs = [("gen", bn, bk, w, 0) for bn in (64, 128, 256) for bk in (8, 16, 32) for w in (4,)]
            if M == 1:
                cfgs += [
                    ("fix", bn, bk, w, sp)
                    for bn in (64, 128, 256, 512)
                    for bk in (4, 8, 16)
                    for w in (4, 8)
                    for sp in (8, 16, 32)
                    if K % (sp * bk) == 0
                ]
        for cfg in cfgs:
            kind, bn, bk, w, extra = cfg
            try:
                if kind == "gen":
                    BM = triton.next_power_of_2(M)
                    if BM * bn * bk > 16384 and not extra:
                        continue
                    grid = (triton.cdiv(N, bn),)

                    def tri():
                        for b, y in zip(bs, ys):
                            gemv_generic[grid](
                                x,
                                b,
                                y,
                                M,
                                N,
                                K,
                                x.stride(0),
                                x.stride(1),
                                b.stride(0),
                                b.stride(1),
                                BM=BM,
                                BN=bn,
                                BK=bk,
                                SUM_EACH=bool(extra),
                                num_warps=w,
                            )
                else:
                    sp = extra
                    part = torch.empty(sp, N, device=dev, dtype=torch.float32)
                    cnt = torch.zeros(triton.cdiv(N, bn), device=dev, dtype=torch.int32)
                    grid = (triton.cdiv(N, bn), sp)

                    def tri():
                        for b, y in zip(bs, ys):
                            gemv_kn_fixup[grid](x, b, part, cnt, y, N, K, BLOCK_N=bn, BLOCK_K=bk, SPLIT=sp, num_warps=w)

                ys[0].zero_()
                tri()
                torch.cuda.synchronize()
                err = (ys[0].float() - ref).abs().max().item()
                tt = graph_time(tri) / R * 1e3
                ys[0].zero_()
                tri()
                torch.cuda.synchronize()
                err = max(err, (ys[0].float() - ref).abs().max().item())
            except Exception as e:
                print("  ", cfg, "failed", type(e).__name__, str(e)[:300], flush=True)
                continue
            res.append([list(cfg), round(tt, 2), round(err, 4)])
        res.sort(key=lambda r: r[1])
        print(
            f"{name:15s} M={M} K={K} N={N} cuBLAS {tl_:6.2f} us | best {res[0] if res else None} "
            f"({tl_ / res[0][1]:.2f}x)",
            flush=True,
        )
        print("    top", res[1:6], flush=True)
        out.append(dict(shape=name, M=M, K=K, N=N, cublas_us=tl_, triton=res))


def main():
    dev = "cuda"
    dt = torch.bfloat16
    out = []
    nk = [
        ("llama q/o", 2048, 2048),
        ("llama k/v", 2048, 512),
        ("llama gate/up", 2048, 5632),
        ("llama down", 5632, 2048),
        ("gpt2 head", 1024, 50257),
    ]
    kn = [
        ("gpt2 c_attn", 1024, 3072),
        ("gpt2 attn proj", 1024, 1024),
        ("gpt2 c_fc", 1024, 4096),
        ("gpt2 mlp proj", 4096, 1024),
    ]
    for lay, shapes in (("nk", nk), ("kn", kn)):
        for name, K, N in shapes:
            bench_shape(lay, name, K, N, dev, dt, out)
            torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
