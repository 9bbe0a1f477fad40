"""Where contracting a multiply and an add into one FMA changes a result that eager rounds twice.

    python -m benchmarks.experiments.fp_contraction OUT.json

Triton contracts `a * b + c` into an FMA unless a kernel is compiled with
enable_fp_fusion=False; eager rounds the product first (each op is its own kernel). Where the
sum cancels the product (`x * c - max(x * c)` inside softmax, `x * y - x * y`) the FMA leaves the
product's rounding error instead of 0. Each case runs eagerly, through minicomp and through
Inductor (on the GPU), and reports the largest difference from eager and the NaNs each makes.
minicomp compiles reduction kernels without contraction (launch.py `options`) and keeps it for
pointwise kernels, which compute each value once; the cancelling pointwise cases are here to show
what that leaves.
"""

from __future__ import annotations

import torch

import minicomp
from benchmarks.experiments import harness


def _cases(device, rows: int):
    x = torch.randn(rows, 1000, device=device)
    y = torch.randn(rows, 1000, device=device)
    return {
        # reductions: a product recomputed after its row's max or mean
        "softmax(x * 1e30)": (lambda x: torch.softmax(x * 1e30, -1), [x]),
        "log_softmax(x * 3e8)": (lambda x: torch.log_softmax(x * 3e8, -1), [x]),
        "softmax(x * 1e5)": (lambda x: torch.softmax(x * 1e5, -1), [x]),
        "layer_norm(x * 1e4 + 1e8)": (lambda x: torch.layer_norm(x * 1e4 + 1e8, [1000]), [x]),
        "x * 1e8 - (x * 1e8).mean(-1)": (lambda x: x * 1e8 - (x * 1e8).mean(-1, keepdim=True), [x]),
        # pointwise: one product used twice, cancelled
        "p = x * y; p - p": (lambda x, y: (lambda p: p - p)(x * y), [x, y]),
        "x * y - x * y": (lambda x, y: x * y - x * y, [x, y]),
        "(x * 1e5 + 1) - x * 1e5": (lambda x: (x * 1e5 + 1) - x * 1e5, [x]),
    }


def _compare(result, expected) -> dict:
    diff = (result.double() - expected.double()).abs()
    finite = torch.isfinite(expected)
    return dict(
        max_abs_diff=float(diff[finite].nan_to_num(float("inf")).max()),
        nans=int(result.isnan().sum()),
        eager_nans=int(expected.isnan().sum()),
    )


def main(argv=None):
    run = harness.parse(argv, __doc__)
    impls = {"minicomp": lambda fn: minicomp.jit(fn, fallback="raise")}
    if not run.tiny:
        impls["inductor"] = torch.compile
    rows = []
    for name, (fn, inputs) in _cases(run.device, 4 if run.tiny else 64).items():  # (tiny: rows interpreted)
        expected = fn(*inputs)
        for impl, make in impls.items():
            if impl == "inductor":
                torch._dynamo.reset()
            row = dict(case=name, impl=impl, **_compare(make(fn)(*inputs), expected))
            rows.append(row)
            print(f"{name:30s} {impl:9s} max |diff| {row['max_abs_diff']:.3g}, NaN {row['nans']} ({row['eager_nans']})")
    run.write(rows=rows)


if __name__ == "__main__":
    main()
