"""How a scan kernel should walk its rows, measured (codegen/scan.py).

    python -m benchmarks.experiments.scan_forms OUT.json

A float32 cumsum (`running_sum`: top-p sampling's running mass) over rows of 32000 and of 4096
in float32 and bfloat16, minicomp's whole call (tuned as a user's first call tunes it) under each
setting of the form's tunables, beside eager and Inductor, against the memory floor: the row
walked `scan_block` elements a step (the running total carried from step to step), or held whole.
config.py's `scan_block` comes from this (its first run varied `loop_block`, which scans then took).
"""

from __future__ import annotations

import sys

import torch

import minicomp
from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure
from minicomp.plan.steps import ScanKernel
from minicomp.tools.workloads import running_sum

DTYPES = (torch.bfloat16, torch.float32)
CASES = ((8192, 32000), (65536, 4096), (1, 1024))  # (rows, width)
SETTINGS = [
    ("looped 1024", dict(persistent_bytes=0, scan_block=1024)),
    ("looped 2048", dict(persistent_bytes=0, scan_block=2048)),
    ("looped 4096", dict(persistent_bytes=0, scan_block=4096)),
    ("looped 8192", dict(persistent_bytes=0, scan_block=8192)),
    ("persistent", dict(persistent_bytes=1 << 20, persistent_rows=1 << 15)),
    ("default", {}),
]
TINY = [(torch.float32, 4, 300)]


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    cases = TINY if run.tiny else [(d, r, w) for d in DTYPES for r, w in CASES]
    rows = []
    for dtype, size, width in cases:
        make = lambda rows, dtype, device, width=width: [torch.randn(rows, width, dtype=dtype, device=device)]  # noqa: E731
        sets = run.input_sets(make, size, dtype)
        floor = measure.floor_bytes(sets[0], [running_sum(*sets[0])], False) / bandwidth * 1e3

        def record(impl, fn, **extra):
            ms = run.time_ms(fn, sets)
            row = dict(dtype=str(dtype)[6:], rows=size, width=width, impl=impl, ms=ms, x_floor=ms / floor)
            rows.append(row | extra)
            print(rows[-1], flush=True)

        if not run.tiny:
            record("eager", running_sum)
            record("inductor", torch.compile(running_sum))
        for label, setting in SETTINGS:
            harness.fresh_cache()
            with config.override(**setting):
                fn = minicomp.jit(running_sum)
                compiled = fn.compiled(*sets[0])
            forms = [k.form for k in compiled.plan.kernels if isinstance(k, ScanKernel)]
            record(f"minicomp {label}", fn, form=forms)
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
