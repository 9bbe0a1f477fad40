"""Pointwise kernels on a persistent grid, timed against the grid of one program a block.

    python -m benchmarks.experiments.persistent_grid OUT.json

Issue #18's small, realistic sizes (a 40-80 us kernel: launch tail, a partial last wave) and
its suggestion: programs = a multiple of the SMs, each looping over blocks. For each workload
(one generated pointwise kernel: bias + ReLU and GELU at [8192, 8192], the RoPE forms at
S = 2048; a combined launch is skipped), minicomp's kernel runs bare as written (one program a
block, its tuned BLOCK_SIZE and warps) and edited: the body in
`for step in tl.range(0, ceil(blocks / programs), num_stages=S)` over `block = pid + step *
programs` on `waves` x SM-count programs. Timed as the bench times (do_bench, an L2 flush
before each run; the variants in turn, 2 rounds, least kept), as a multiple of the kernel's
floor (its arguments' bytes over the copy bandwidth). `error`: each variant's outputs against
the as-written kernel's. A measurement aid only: minicomp emits the plain grid.
"""

from __future__ import annotations

import re
import sys

import torch

import minicomp
from benchmarks.experiments import harness
from benchmarks.experiments.reduction_variants import helpers
from minicomp.bench import measure
from minicomp.tools.workloads import WORKLOADS

CASES = [("bias_relu", 8192), ("gelu_tanh", 8192), ("rope_neox_partial", 2048), ("rope_gptj", 2048), ("rope_gqa", 2048)]
TINY = [("bias_relu", 8)]
# (waves of SM-count programs, num_stages); None: as written
VARIANTS = [None, (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (4, 2), (8, 1)]
TINY_VARIANTS = [None, (1, 2)]
ROUNDS = 2


def persistent(text: str, stages: int, programs: int, blocks: int) -> str:
    """The kernel's body after `pid = tl.program_id(0)` looped over the blocks `pid` strides through,
    `programs` at a time (a constant trip count; a block past the last is masked off by the
    kernel's own `offsets < n_elements`)."""
    head, body = text.split("    pid = tl.program_id(0)\n", 1)
    body = re.sub(r"\bpid\b", "block", body)
    lines = [("    " + line if line.strip() else line) for line in body.splitlines()]
    loop = (
        "    pid = tl.program_id(0)\n"
        f"    for step in tl.range(0, {-(-blocks // programs)}, num_stages={stages}):\n"
        f"        block = pid + step * {programs}\n"
    )
    return head + loop + "\n".join(lines) + "\n"


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    sms = 2 if run.tiny else torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for wname, size in TINY if run.tiny else CASES:
        for dtype in (torch.float32,) if run.tiny else (torch.bfloat16, torch.float32):
            work = WORKLOADS[wname]
            sets = run.input_sets(work.make, size, dtype)
            harness.fresh_cache()
            jit = minicomp.jit(work.fn)
            jit(*sets[0])  # tunes the launch config
            compiled = jit.compiled(*sets[0])
            lone = harness.lone_pointwise(compiled)
            if lone is None:
                print(f"{wname}: not one pointwise kernel launched alone: skipped", flush=True)
                continue
            call, launch, text = lone
            block, warps = launch.config or launch.heuristic()
            block = 4096 if run.tiny else block  # tiny: several blocks a program, so the loop is exercised
            args = [compiled.bare_arguments(call, list(s)) for s in sets]
            blocks = launch.grid(block)
            floor_ms = measure.tensor_bytes(args[0]) / bandwidth * 1e3
            cases, reference = [], None
            for variant in TINY_VARIANTS if run.tiny else VARIANTS:
                kernel, grid, name = launch.kernel, blocks, "as written"
                if variant is not None:
                    waves, stages = variant
                    grid = min(blocks, waves * sms)
                    name = f"persistent, {waves} x SMs, num_stages={stages}"
                    source = persistent(text, stages, grid, blocks)
                    kernel = harness.kernel_from_text(source + "\n\n\n" + helpers(compiled.source), name)
                go = lambda *a, k=kernel, g=grid: k[(g,)](*a, **{launch.block_name: block}, num_warps=warps)  # noqa: E731
                outs = harness.written(call, args[0], go)
                reference = reference or outs
                error = harness.error_against(outs, reference)
                row = dict(
                    workload=wname,
                    dtype=str(dtype)[6:],
                    size=size,
                    variant=name,
                    programs=grid,
                    blocks=blocks,
                    block=block,
                    warps=warps,
                    error=error,
                    floor_ms=floor_ms,
                )
                cases.append((row, go, args))
            rows += harness.time_in_turn(run, cases, ROUNDS)
    run.write(bandwidth_gbps=bandwidth / 1e9, sms=sms, rounds=ROUNDS, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
