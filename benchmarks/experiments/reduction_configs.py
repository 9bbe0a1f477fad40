"""Reduction kernels: their tunables and launch configurations, timed beside Inductor.

    python -m benchmarks.experiments.reduction_configs OUT.json

For each case (a bench workload, dtype and size) and each setting of the
tunables that shape its kernels (config: `loop_block` for a looped row,
`outer_block` and `split_programs` for column sums and global means), the
workload is compiled afresh; then its first reduction kernel runs with each
(XBLOCK, num_warps) of a grid wider than launch.py's candidates, and the whole
function is timed the way `minicomp bench` times (median of do_bench over
input sets that rotate past L2), as a multiple of the memory floor. Inductor
runs beside it, and the Triton kernels it generated are kept (`inductor_code`)
to see what it does differently. config.py's defaults come from this sweep.
REDUCTION_CASES="cross_entropy rms_norm" runs only those workloads' cases.
"""

from __future__ import annotations

import os
import re
import sys

import torch

import minicomp
from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure
from minicomp.tools.workloads import WORKLOADS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# (workload, dtype, size, settings to try, (XBLOCK, num_warps) grid)
ROW_GRID = [(1, 8), (1, 16), (1, 32), (2, 16), (2, 32), (4, 32)]
LOOP_GRID = [(1, 1), (1, 2), (1, 4), (1, 8)]
OUTER_GRID = [(x, w) for x in (32, 64, 128) for w in (4, 8)]
SPLITS = [dict(split_programs=1024, split_chunk=2048), dict(split_programs=4096, split_chunk=256)]
CASES = [
    ("rms_norm", "float32", 32768, [{}, dict(persistent_rows=1024, loop_block=2048)], ROW_GRID),
    ("cross_entropy", "bfloat16", 8192, [{"loop_block": b} for b in (4096, 8192)], LOOP_GRID),
    ("cross_entropy_128k", "bfloat16", 4096, [{"loop_block": b} for b in (4096, 8192)], LOOP_GRID),
    ("column_sum", "bfloat16", 32768, [dict(outer_block=b, **s) for b in (32, 64) for s in SPLITS], OUTER_GRID),
    ("column_sum", "float32", 8192, [dict(outer_block=32, **s) for s in SPLITS], OUTER_GRID),
    ("mse_loss", "float32", 32768, [{"split_programs": p} for p in (1024, 4096, 16384)], [None]),
    ("head_sum", "bfloat16", 2048, [{"outer_block": b} for b in (8, 32, 64)], OUTER_GRID + [(256, 8), (64, 2)]),
]
TINY = [("rms_norm", "float32", 4, [{}], [(1, 1)]), ("column_sum", "float32", 64, [{"split_programs": 64}], [None])]


def first_reduction(compiled):
    """The Launch of the first reduction kernel of a compiled function (None when it has none)."""
    for kernel in compiled.kernels:
        launch = compiled.launch(kernel)
        if kernel.kind == "reduction":
            return launch
    return None


def inductor_kernels(fn, inputs) -> str:
    """The @triton.jit functions Inductor generated for fn."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(fn), *inputs)
    found = []
    for code in codes:
        found += re.findall(r"@triton\.jit\ndef .*?(?=\n'''|\n\"\"\"|\Z)", code, flags=re.S)
    return "\n\n".join(found)


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows, code = [], {}
    only = os.environ.get("REDUCTION_CASES", "").split()  # workload names: run only these
    for wname, dname, size, settings, grid in TINY if run.tiny else CASES:
        if only and wname not in only:
            continue
        work, dtype = WORKLOADS[wname], DTYPES[dname]
        sets = run.input_sets(work.make, size, dtype)
        floor = measure.floor_bytes(sets[0], measure.flat_tensors(work.fn(*sets[0])), False) / bandwidth * 1e3

        def record(impl, fn, **extra):
            ms = run.time_ms(fn, sets)
            rows.append(dict(workload=wname, dtype=dname, size=size, impl=impl, ms=ms, x_floor=ms / floor, **extra))
            print(rows[-1], flush=True)

        if not run.tiny:
            record("inductor", torch.compile(work.fn))
            code[f"{wname} {dname} {size}"] = inductor_kernels(work.fn, sets[0])
        for setting in settings:
            harness.fresh_cache()
            with config.override(**setting):
                fn = minicomp.jit(work.fn)
                compiled = fn.compiled(*sets[0])
            launch = first_reduction(compiled)
            record("minicomp (tuned)", fn, **setting, kernels=len(compiled.kernels), chosen=launch and launch.config)
            for xw in grid:
                if xw is None or launch is None:
                    continue
                launch.config, launch._fast = xw, None  # the next call binds this configuration
                record("minicomp", fn, **setting, xblock=xw[0], warps=xw[1])
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows, inductor_code=code)


if __name__ == "__main__":
    main(sys.argv[1:])
