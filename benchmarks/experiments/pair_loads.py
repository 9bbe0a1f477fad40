"""Instructions per element of GPT-J's rotary, walked with its pairs masked or interleaved.

    python -m benchmarks.experiments.pair_loads OUT.json

GPT-J rotates pairs (x[2i], x[2i+1]) -> (-x[2i+1], x[2i]). Walked element by element, each
lane loads q at its own address and at its pair partner's under a parity mask (three loads an
element, two of them 16-bit scalar loads). Walked as two interleaved parts (codegen/parts.py)
with each pair loaded by one contiguous load split in two (codegen/pointwise.py), every element
is loaded once by a full-width vector load. This compiles minicomp's forward and backward
kernels both ways for sm_90 on any machine (sass_count.py's way) at BLOCK_SIZE 512 (256 pairs)
and 4 warps, and counts SASS instructions (NOPs aside) and global loads per element a thread
writes.
"""

from __future__ import annotations

import sys

import torch

import minicomp
from benchmarks.experiments import harness
from benchmarks.experiments import sass_count as sc
from minicomp import config, runtime
from minicomp.tools.workloads import WORKLOADS

ELEMENTS = 512  # written per program, either walk


def modules(run, dtype, max_parts):
    """minicomp's forward and backward modules of GPT-J's rotary, imported compiled."""
    work = WORKLOADS["rope_gptj_fwbw"]
    inputs = work.make(4 if run.tiny else 2048, dtype, "cpu")
    with config.override(max_parts=max_parts):
        fn = minicomp.jit(work.fn, fallback="raise")
        outs = fn(*inputs)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        entry = fn.entry(*inputs)
    result = {}
    for part, compiled in (("forward", entry.forward), ("backward", entry.backward)):
        module = runtime.load(compiled.source, f"pair_loads_{part}_{max_parts}", interpret=False)
        result[part] = getattr(module, compiled.kernels[0].launcher)
    return result


def main(argv=None):
    run = harness.parse(argv, __doc__)
    threads = sc.WARPS * 32
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for label, max_parts in (("masked", 1), ("interleaved", config.DEFAULTS["max_parts"])):
            for part, launch in modules(run, dtype, max_parts).items():
                lines = sc.sass(launch, dtype, block=ELEMENTS // launch.spec.parts)
                ops = sc.opcodes(lines, modifiers=True)
                per_thread = ELEMENTS // threads
                rows.append(
                    dict(
                        dtype=str(dtype)[6:],
                        part=part,
                        walk=label,
                        instructions=len(lines),
                        per_element=len(lines) / per_thread,
                        loads_per_element=sum(n for op, n in ops.items() if op.startswith("LDG")) / per_thread,
                        loads={op: n for op, n in ops.items() if op.startswith(("LDG", "STG"))},
                    )
                )
                print(rows[-1], flush=True)
    run.write(target="sm_90", elements=ELEMENTS, warps=sc.WARPS, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
