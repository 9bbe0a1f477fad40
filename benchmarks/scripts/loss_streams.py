"""Issue #41's loss by row chunks: its three matmuls a chunk in order on one stream, against W's
gradient summed on a second stream beside the h gradient's and the next chunk's product.

    PYTHONPATH=. python benchmarks/scripts/loss_streams.py       # repository root, a GPU

bf16, h [8192, 4096], W [128256, 4096]; a chunk: P = h_c @ W.T, P written over in place (the
joint kernel's stand-in: `mul_`), h's gradient rows P @ W, W's gradient += P.T @ h_c (the first
chunk writes it). Chunks of 512 rows hold one 128 MiB product; of 256 rows, two products (the
same 128 MiB) so a chunk's W-gradient sum can run beside the next chunk's product. GPU ms by
CUDA events, the least of 5 runs, and each variant's W and h gradients against the first's.
"""

import torch

from benchmarks.scripts.loss_matmuls import D, N, V, best_ms


def whole(h, W, dh, dW):
    P = torch.mm(h, W.t())
    P.mul_(0.5)
    torch.mm(P, W, out=dh)
    torch.mm(P.t(), h, out=dW)


def in_order(h, W, dh, dW, rows=512):
    P = torch.empty(rows, V, device="cuda", dtype=torch.bfloat16)
    for s in range(0, N, rows):
        torch.mm(h[s : s + rows], W.t(), out=P)
        P.mul_(0.5)
        torch.mm(P, W, out=dh[s : s + rows])
        if s == 0:
            torch.mm(P.t(), h[:rows], out=dW)
        else:
            dW.addmm_(P.t(), h[s : s + rows])


def beside(h, W, dh, dW, rows=512, buffers=1, side=None):
    """W's gradient on `side`; a product buffer is written again once side's sum read it."""
    main = torch.cuda.current_stream()
    products = [torch.empty(rows, V, device="cuda", dtype=torch.bfloat16) for _ in range(buffers)]
    read = [None] * buffers
    for i, s in enumerate(range(0, N, rows)):
        P = products[i % buffers]
        if read[i % buffers] is not None:
            main.wait_event(read[i % buffers])
        torch.mm(h[s : s + rows], W.t(), out=P)
        P.mul_(0.5)
        ready = torch.cuda.Event()
        ready.record(main)
        with torch.cuda.stream(side):
            side.wait_event(ready)
            if s == 0:
                torch.mm(P.t(), h[:rows], out=dW)
            else:
                dW.addmm_(P.t(), h[s : s + rows])
            done = torch.cuda.Event()
            done.record(side)
        read[i % buffers] = done
        torch.mm(P, W, out=dh[s : s + rows])
    main.wait_stream(side)


def main():
    torch.manual_seed(0)
    h = torch.randn(N, D, device="cuda", dtype=torch.bfloat16) * 0.05
    W = torch.randn(V, D, device="cuda", dtype=torch.bfloat16) * 0.05
    dh = torch.empty(N, D, device="cuda", dtype=torch.bfloat16)
    dW = torch.empty(V, D, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    variants = {
        "whole (3 GEMMs, the logits whole)": lambda: whole(h, W, dh, dW),
        "512 rows in order": lambda: in_order(h, W, dh, dW, 512),
        "256 rows in order": lambda: in_order(h, W, dh, dW, 256),
        "512 rows, W's sum beside h's": lambda: beside(h, W, dh, dW, 512, 1, side),
        "256 rows x2 buffers, W's sum beside": lambda: beside(h, W, dh, dW, 256, 2, side),
        "512 rows x2 buffers (256 MiB), W's sum beside": lambda: beside(h, W, dh, dW, 512, 2, side),
    }
    reference = None
    for name, fn in variants.items():
        ms = best_ms(fn)
        got = (dh.float().clone(), dW.float().clone())
        if reference is None:
            reference = got
        err = max((a - b).abs().max().item() / b.abs().max().item() for a, b in zip(got, reference))
        print(f"{name}: {ms:.2f} ms (relative difference from the first {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
