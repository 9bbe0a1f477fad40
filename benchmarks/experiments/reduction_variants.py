"""Hand-edited variants of generated reduction kernels, timed: what a codegen change would buy.

    python -m benchmarks.experiments.reduction_variants OUT.json

For the headline cross-entropy (bf16, [8192, 32000]) and RMSNorm (fp32,
[32768, 4096]), the first reduction kernel minicomp writes is launched bare
(its own arguments, a fixed XBLOCK and warp count) as written and with one
edit of its text each: a software-pipelined loop (`tl.range(..., num_stages=)`),
eviction hints on the streaming load, no row mask. Timed as the bench times
(median of do_bench over input sets rotating past L2), against the memory floor
of the whole workload. A measurement aid only; minicomp emits the plain text.
"""

from __future__ import annotations

import inspect
import re
import sys

import torch

import minicomp
from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure
from minicomp.workloads import WORKLOADS

# (workload, dtype, size, config, [(variant, edit of the kernel text, XBLOCK, warps)])
CE_LOOP = re.compile(r"for roffset in range\((\d+), (\d+), RBLOCK\)")
CASES = [
    (
        "cross_entropy",
        torch.bfloat16,
        8192,
        dict(loop_block=4096),
        [
            ("as written", None, 1, 4),
            ("as written, 2 warps", None, 1, 2),
            (
                "tl.range num_stages=2",
                lambda s: CE_LOOP.sub(r"for roffset in tl.range(\1, \2, RBLOCK, num_stages=2)", s),
                1,
                4,
            ),
            (
                "tl.range num_stages=3",
                lambda s: CE_LOOP.sub(r"for roffset in tl.range(\1, \2, RBLOCK, num_stages=3)", s),
                1,
                4,
            ),
            ("load evict_first", lambda s: s.replace("other=0)", "other=0, eviction_policy='evict_first')", 1), 1, 4),
        ],
    ),
    (
        "rms_norm",
        torch.float32,
        32768,
        {},
        [
            ("as written", None, 2, 32),
            ("as written, 1 row", None, 1, 16),
            (
                "x load evict_first",
                lambda s: s.replace("other=0)", "other=0, eviction_policy='evict_first')", 1),
                2,
                32,
            ),
            ("no row mask", lambda s: s.replace("mask=xmask & rmask", "mask=rmask"), 2, 32),
        ],
    ),
]
TINY = [("rms_norm", torch.float32, 4, {}, [("as written", None, 1, 1)])]  # edits: GPU only (JIT text)


def helpers(source: str) -> str:
    """The module's @triton.jit helpers (_sum, _max_nan, ...) as text."""
    return "\n\n".join(re.findall(r"@triton\.jit\ndef _\w+\(.*?(?=\n\n\n|\n\n@|\n\n#)", source, flags=re.S))


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows = []
    for wname, dtype, size, settings, variants in TINY if run.tiny else CASES:
        work = WORKLOADS[wname]
        sets = run.input_sets(work.make, size, dtype)
        floor = measure.floor_bytes(sets[0], measure.flat_tensors(work.fn(*sets[0])), False) / bandwidth * 1e3
        harness.fresh_cache()
        with config.override(**settings):
            compiled = minicomp.jit(work.fn).compiled(*sets[0])
        call = compiled.kernels[0]
        launch = compiled.launch(call)
        text = getattr(launch.kernel, "src", None) or inspect.getsource(launch.kernel.fn)  # JIT or interpreter
        text = text if text.lstrip().startswith("@") else "@triton.jit\n" + text  # JITFunction.src has no decorator
        args = [compiled.bare_arguments(call, list(s)) for s in sets]
        for name, edit, xblock, warps in variants:
            kernel = launch.kernel
            if edit is not None:
                kernel = harness.kernel_from_text(
                    edit(text) + "\n\n\n" + helpers(compiled.source), name
                )  # kernel first
            grid = (launch.grid(xblock),)
            ms = run.bench(lambda *a, k=kernel: k[grid](*a, XBLOCK=xblock, num_warps=warps), args)
            rows.append(
                dict(
                    workload=wname,
                    dtype=str(dtype),
                    size=size,
                    variant=name,
                    xblock=xblock,
                    warps=warps,
                    ms=ms,
                    x_floor=ms / floor,
                )
            )
            print(rows[-1], flush=True)
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
