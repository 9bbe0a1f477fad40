"""Issue #41's loss's three matmuls whole (Inductor's) and by row chunks (minicomp's at a budget),
and W's gradient summed by chunks with Triton tiles against cuBLAS.

    PYTHONPATH=. python benchmarks/scripts/loss_matmuls.py [--triton]

bf16, h [8192, 4096], W [128256, 4096], G a [8192, V] gradient; GPU ms by CUDA events (the least of
5 runs). Whole: h @ W.T, G @ W, G.T @ h. By chunks of 256-2048 rows: each chunk's product, its
h gradient into its rows, and W's gradient summed over the chunks (zeroed then `addmm_` each
chunk; the first chunk written by `mm`; summed transposed). What a 128 MiB budget (512 rows)
costs against the whole products is the matmuls' part of the loss's time against Inductor.
--triton: one chunk's C [V, D] += A [512, V].T @ B [512, D] as a Triton tile (sizes, warps,
stages, C loaded before or after the K loop) against cuBLAS's `addmm_`. The GPU only.
"""

import itertools
import sys

import torch
import triton
import triton.language as tl

N, D, V = 8192, 4096, 128256


def best_ms(fn, reps=5) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def chunked(h, W, G) -> None:
    dh = torch.empty(N, D, device="cuda", dtype=torch.bfloat16)
    dW = torch.empty(V, D, device="cuda", dtype=torch.bfloat16)
    whole = (
        best_ms(lambda: torch.mm(h, W.t())),
        best_ms(lambda: torch.mm(G, W, out=dh)),
        best_ms(lambda: torch.mm(G.t(), h, out=dW)),
    )
    print("whole: product {:.3f}  h's gradient {:.3f}  W's gradient {:.3f} ms".format(*whole), flush=True)
    for rows in (256, 512, 1024, 2048):
        by_chunks(h, W, G, dh, dW, rows)


def by_chunks(h, W, G, dh, dW, rows: int) -> None:
    cuts = [(s, s + rows) for s in range(0, N, rows)]
    product = torch.empty(rows, V, device="cuda", dtype=torch.bfloat16)
    transposed = torch.zeros(D, V, device="cuda", dtype=torch.bfloat16)

    def products():
        for s, e in cuts:
            torch.mm(h[s:e], W.t(), out=product)

    def h_grads():
        for s, e in cuts:
            torch.mm(G[s:e], W, out=dh[s:e])

    def w_zeroed():
        dW.zero_()
        for s, e in cuts:
            dW.addmm_(G[s:e].t(), h[s:e])

    def w_first_written():
        torch.mm(G[:rows].t(), h[:rows], out=dW)
        for s, e in cuts[1:]:
            dW.addmm_(G[s:e].t(), h[s:e])

    def w_transposed():
        for s, e in cuts:
            transposed.addmm_(h[s:e].t(), G[s:e])

    print(
        f"rows {rows} x{len(cuts)} ({rows * V * 2 / 2**20:.0f} MiB a chunk): product {best_ms(products):.3f}  "
        f"h's gradient {best_ms(h_grads):.3f}  W's gradient zeroed + addmm_ {best_ms(w_zeroed):.3f}  "
        f"first written {best_ms(w_first_written):.3f}  transposed {best_ms(w_transposed):.3f} ms",
        flush=True,
    )


@triton.jit
def _sum_into(
    a, b, c, M, N_, K, sa_k, sa_m, sb_k, sb_n, sc_m, sc_n,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EARLY: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """c [M, N_] += a [K, M].T @ b [K, N_], tiles in groups of GROUP rows of tiles."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N_, BN)
    width = GROUP * tiles_n
    first = pid // width * GROUP
    size = min(tiles_m - first, GROUP)
    pm, pn = first + (pid % width) % size, (pid % width) // size
    rm, rn, rk = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    at_c = c + rm[:, None] * sc_m + rn[None, :] * sc_n
    mask = (rm[:, None] < M) & (rn[None, :] < N_)
    if EARLY:
        old = tl.load(at_c, mask=mask, other=0.0)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + (k + rk)[None, :] * sa_k + rm[:, None] * sa_m, mask=rm[:, None] < M, other=0.0)
        y = tl.load(b + (k + rk)[:, None] * sb_k + rn[None, :] * sb_n)
        acc = tl.dot(x, y, acc)
    if not EARLY:
        old = tl.load(at_c, mask=mask, other=0.0)
    tl.store(at_c, (acc + old.to(tl.float32)).to(c.dtype.element_ty), mask=mask)


def triton_tiles(rows: int = 512) -> None:
    a = torch.randn(rows, V, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(rows, D, device="cuda", dtype=torch.bfloat16)
    start = torch.randn(V, D, device="cuda", dtype=torch.bfloat16)
    c = start.clone()
    library = best_ms(lambda: c.addmm_(a.t(), b), reps=10)
    want = start.float() + a.t().float() @ b.float()
    flops_ms, traffic_ms = 2 * V * D * rows / 1e12, 2 * V * D * 2 / 4.8e9
    print(f"one chunk of {rows} rows: cuBLAS addmm_ {library:.3f} ms (its flops at 1000 TFLOP/s {flops_ms:.3f} ms; "
          f"C read and written at 4.8 TB/s {traffic_ms:.3f} ms)", flush=True)  # fmt: skip
    for bm, bn, warps, stages, early in itertools.product((128, 256), (128, 256), (4, 8), (3, 4), (0, 1)):
        if bm * bn > 128 * 256 or (bm * bn == 128 * 256 and warps == 4):
            continue
        c = start.clone()

        def run():
            _sum_into[(triton.cdiv(V, bm) * triton.cdiv(D, bn),)](
                a, b, c, V, D, rows, *a.stride(), *b.stride(), *c.stride(),
                BM=bm, BN=bn, BK=64, EARLY=early, GROUP=8, num_warps=warps, num_stages=stages,
            )  # fmt: skip

        run()
        torch.cuda.synchronize()
        error = (c.float() - want).abs().max().item()
        ms = best_ms(run, reps=10)
        print(f"  tile {bm} x {bn}, {warps} warps, {stages} stages, C loaded {'first' if early else 'last'}: "
              f"{ms:.3f} ms ({ms / library:.2f}x cuBLAS), max error {error:.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    torch.manual_seed(0)
    if "--triton" in sys.argv:
        triton_tiles()
    else:
        chunked(
            torch.randn(N, D, device="cuda", dtype=torch.bfloat16),
            torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.02,
            torch.randn(N, V, device="cuda", dtype=torch.bfloat16),
        )
