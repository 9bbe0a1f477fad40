"""Persistent or looped: which form a row reduction should take, measured.

    python -m benchmarks.experiments.reduction_forms OUT.json

For the norms and softmax over rows of 4096 in float32 and bfloat16 (rows 8192 and 32768),
minicomp's whole call (tuned as a user's first call tunes it) under each setting of the form's
tunables, beside Inductor, against the memory floor: the rows held whole in registers
(persistent), or walked in two passes of `loop_block` elements (looped, the second pass reading
the row again from L2 under eviction hints). config.py's `persistent_bytes` comes from this.
REDUCTION_FORMS="rms_norm softmax" runs only those workloads; REDUCTION_WIDTHS="1024 2048 8192"
rows of those lengths instead of 4096 (every [.., 4096] input made [.., W], rows 32768 * 4096 / W);
REDUCTION_SIZES="2048" those row counts instead of 8192 and 32768.
"""

from __future__ import annotations

import os
import sys

import torch

import minicomp
from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure
from minicomp.plan.steps import ReductionKernel
from minicomp.tools.workloads import WORKLOADS

WORKLOADS_SWEPT = ("rms_norm", "add_rms_norm", "layer_norm", "softmax")
DTYPES = (torch.float32, torch.bfloat16)
SIZES = (8192, 32768)
SETTINGS = [
    ("persistent", dict(persistent_bytes=1 << 20)),
    ("looped 2048", dict(persistent_bytes=0, loop_block=2048)),
    ("looped 4096", dict(persistent_bytes=0, loop_block=4096)),
    ("default", {}),
]
TINY = [("rms_norm", torch.float32, 4)]


def with_width(make, width: int):
    """`make` with every input of rows of 4096 made rows of `width` (random, same dtype and device)."""
    if width == 4096:
        return make

    def made(rows, dtype, device):
        return [
            torch.randn(t.shape[:-1] + (width,), dtype=t.dtype, device=t.device)
            if t.dim() and t.shape[-1] == 4096
            else t
            for t in make(rows, dtype, device)
        ]

    return made


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    only = os.environ.get("REDUCTION_FORMS", "").split()
    widths = [int(w) for w in os.environ.get("REDUCTION_WIDTHS", "").split()]
    if run.tiny:
        cases = [(w, d, s, 4096) for w, d, s in TINY]
    elif widths:
        cases = [(w, d, 32768 * 4096 // n, n) for w in WORKLOADS_SWEPT for d in DTYPES for n in widths]
    else:
        sizes = [int(n) for n in os.environ.get("REDUCTION_SIZES", "").split()] or SIZES
        cases = [(w, d, s, 4096) for w in WORKLOADS_SWEPT for d in DTYPES for s in sizes]
    rows = []
    for wname, dtype, size, width in cases:
        if only and wname not in only:
            continue
        work = WORKLOADS[wname]
        sets = run.input_sets(with_width(work.make, width), size, dtype)
        floor = measure.floor_bytes(sets[0], measure.flat_tensors(work.fn(*sets[0])), False) / bandwidth * 1e3

        def record(impl, fn, **extra):
            ms = run.time_ms(fn, sets)
            rows.append(
                dict(workload=wname, dtype=str(dtype)[6:], size=size, width=width, impl=impl, ms=ms, x_floor=ms / floor)
                | extra
            )
            print(rows[-1], flush=True)

        if not run.tiny:
            record("inductor", torch.compile(work.fn))
        for label, setting in SETTINGS:
            harness.fresh_cache()
            with config.override(**setting):
                fn = minicomp.jit(work.fn)
                compiled = fn.compiled(*sets[0])
            forms = [k.looped for k in compiled.plan.kernels if isinstance(k, ReductionKernel)]
            record(f"minicomp {label}", fn, looped=forms)
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
