"""Issue #41's table: the vocabulary projection and its cross-entropy, forward + backward.

    python -m benchmarks.experiments.chunked_loss OUT.json

bf16 h [8192, 4096], W [128256, 4096] (a Llama-3 vocabulary), y [8192] with some rows
ignored; `F.cross_entropy((h @ W.T).float(), y)` forward + backward (gradients of h and W)
for eager, Inductor and minicomp's Dynamo backend (which computes the product and the loss
by chunks of rows: dispatch/row_regions.py, chunked_rows.py; config "chunk_budget_bytes"),
minicomp with the rewrite off (budget 0), and minicomp at budgets of 64 MiB and 1 GiB (each
chunk's rows are the K of the addmm that adds into W's gradient, which reads and writes all of
it: few rows make that pass memory-bound). Each row: the median step time (ms) and the
peak memory above the inputs (MiB, `minicomp.bench.measure.peak_bytes`: gradients, saved
values and temporaries), that peak less the two gradients' bytes (what the loss itself
needs), and the loss and gradients' error against eager in float32.
With --tiny: [37, 16] @ [103, 16] on the CPU, a budget of a few rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import minicomp.dispatch.dynamo
from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure
from minicomp.dispatch import chunked_rows

MIB = 2**20


def loss(h, W, y):
    return F.cross_entropy((h @ W.T).float(), y)


def main(argv=None):
    run = harness.parse(argv, __doc__)
    n, d, v = (37, 16, 103) if run.tiny else (8192, 4096, 128256)
    budget = 2 * 8 * v * 4 if run.tiny else config.get("chunk_budget_bytes")
    device, dtype = run.device, torch.bfloat16

    def make(_size=None, _dtype=None, _device=None):
        torch.manual_seed(0)
        h = torch.randn(n, d, device=device, dtype=dtype).requires_grad_()
        W = (torch.randn(v, d, device=device) / d**0.5).to(dtype).requires_grad_()
        y = torch.randint(0, v, (n,), device=device)
        y[::17] = -100
        return [h, W, y]

    inputs = make()
    grad_bytes = sum(t.numel() * t.element_size() for t in inputs[:2])
    reference = _step(lambda h, W, y: loss(h.float(), W.float(), y), inputs)
    impls = [("eager", lambda: loss, None), ("minicomp", _compiled, budget), ("minicomp whole", _compiled, 0)]
    if not run.tiny:  # the budget's trade: fewer chunks, fewer passes over W's gradient (its addmm's K is the chunk)
        impls += [
            (f"minicomp {b >> 20} MiB", _compiled, b)
            for b in (64 << 20, 128 << 20, 256 << 20, 512 << 20, 1 << 30)
            if b != budget
        ]
    if not run.tiny:
        impls.insert(1, ("inductor", lambda: torch.compile(loss), None))
    rows = []
    for name, make_fn, chunk_budget in impls:
        torch._dynamo.reset()
        settings = {} if chunk_budget is None else {"chunk_budget_bytes": chunk_budget}
        with config.override(**settings):
            fn = make_fn()
            regions = len(chunked_rows.REGIONS)
            got = _step(fn, inputs)  # compiles
            regions = len(chunked_rows.REGIONS) - regions
            ms = run.time_ms(fn, [inputs], backward=True)
            peak = None if run.tiny else measure.peak_bytes(fn, inputs, backward=True)
        row = dict(
            impl=name,
            chunked_regions=regions,  # regions this row's compile rewrote (dispatch/row_regions.py)
            ms=ms,
            peak_mib=None if peak is None else peak / MIB,
            peak_less_grads_mib=None if peak is None else (peak - grad_bytes) / MIB,
            loss_error=harness.relative_error(got[0], reference[0]),
            grad_h_error=harness.relative_error(got[1], reference[1]),
            grad_w_error=harness.relative_error(got[2], reference[2]),
        )
        rows.append(row)
        print({k: (round(x, 4) if isinstance(x, float) else x) for k, x in row.items()}, flush=True)
    run.write(shape=dict(h=[n, d], W=[v, d], dtype=str(dtype)), budget_bytes=budget, rows=rows)


def _compiled():
    return torch.compile(loss, backend=minicomp.dispatch.dynamo.backend)


def _step(fn, inputs):
    h, W, y = inputs
    out = fn(h, W, y)
    gh, gw = torch.autograd.grad(out, [h, W])
    return [out.detach().float(), gh.float(), gw.float()]


if __name__ == "__main__":
    main()
