"""Program order for a broadcast input: a pointwise kernel's planes walked side by side, timed
against the plain order (program i takes elements [i * BLOCK, (i + 1) * BLOCK)).

    python -m benchmarks.experiments.broadcast_order OUT.json

Why: RoPE's cos/sin [S, D] are read once per (batch, head) plane of q and k. In the plain order the
programs on the GPU at one time all sit in one plane, and a cos/sin line is next read a whole plane
of q, k and their outputs later (fp32, S = 8192: 16 MiB of streaming between two reads of one line,
8 MiB of cos/sin beside it, against a 50 MiB L2 split in two halves). The bench measured rope_fw
float32 1.03x its floor at S = 2048 but 1.11x at S = 8192, where bf16 stays at 1.05x. Walking
`group` planes side by side (program pid: plane (pid // (group * blocks)) * group + pid % group,
block (pid % (group * blocks)) // group of it) runs the programs that read one cos/sin block next to
each other, so the block is read from DRAM once a group. An attention mask [S, S] broadcast over
(batch, head) (workloads.mask_add; 16 MiB at S = 2048 in float32) is the same pattern, larger.

Each case: minicomp's generated kernel as written and edited to each group size (`outer` planes
of `inner` elements, its BLOCK_SIZE and warps as tuned), do_bench with an L2 flush before each run,
in turn, 2 rounds, least kept, as a multiple of the kernel's floor. `copy`: torch copying as many
bytes (the practical floor at that size). `error`: the edited kernel's outputs against the
as-written kernel's (0: the same elements, in another order). The kernel is compiled with the rule
off (`reuse_bytes` past any size), so "as written" is the plain order; minicomp itself walks
planes side by side where codegen/plane_order.py's rule says so.
"""

from __future__ import annotations

import math
import sys

import torch

import minicomp
from benchmarks.experiments import harness
from benchmarks.experiments.reduction_variants import helpers
from minicomp import config
from minicomp.bench import measure
from minicomp.tools.workloads import WORKLOADS

# (name, fn, make(size, dtype, device), size, leading dims of the kernel's iteration space that are the planes)
CASES = [
    ("rope_fw", WORKLOADS["rope_fw"].fn, WORKLOADS["rope_fw"].make, 2048, 2),
    ("rope_fw", WORKLOADS["rope_fw"].fn, WORKLOADS["rope_fw"].make, 8192, 2),
    ("mask_add", WORKLOADS["mask_add"].fn, WORKLOADS["mask_add"].make, 2048, 2),
    ("mask_add", WORKLOADS["mask_add"].fn, WORKLOADS["mask_add"].make, 4096, 2),
]
TINY = [("mask_add", WORKLOADS["mask_add"].fn, WORKLOADS["mask_add"].make, 32, 2)]
ROUNDS = 2
# (planes, blocks of a plane) a tile, planes a program: None: as written; planes past the count: all
GROUPS = [None, (32, 1, 1), (32, 4, 1), (32, 1, 2), (32, 1, 4), (16, 1, 8), (1, 1, 4), (1, 1, 8)]
TINY_GROUPS = [None, (4, 2, 1), (2, 1, 2)]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def planes_grouped(text: str, outer: int, inner: int, block: int, group: int, run: int = 1, each: int = 1) -> str:
    """The kernel with its programs walking `group` planes side by side, `run` blocks of a plane
    at a time: in group `g`, tile `t` holds blocks t * run .. t * run + run - 1 of each of the
    group's planes, plane by plane (programs past the last plane or block are masked off). With
    `each` > 1 a "plane" is `each` planes, one program looping over them (the broadcast block's
    loads hit L1 after the first)."""
    plain = "    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)\n    mask = offsets < n_elements\n"
    assert plain in text, "not the plain pointwise prologue"
    head, body = text.split(plain)
    tiles = cdiv(cdiv(inner, block), run)  # a plane's runs of blocks
    span = group * run * tiles  # the programs of one group of planes
    ordered = (
        f"    within = pid % {span}\n"
        f"    planes = (pid // {span}) * {group} + (within % {group * run}) // {run}\n"
        f"    inner = ((within // {group * run}) * {run} + within % {run}) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)\n"
        f"    for j in tl.static_range({each}):\n"
        f"        plane = planes * {each} + j\n"
        f"        offsets = plane * {inner} + inner\n"
        f"        mask = (inner < {inner}) & (plane < {outer})\n"
    )
    looped = "".join(("    " + line if line.strip() else line) for line in body.splitlines(keepends=True))
    return head + ordered + looped


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows = []
    for wname, fn, make, size, lead in TINY if run.tiny else CASES:
        for dtype in (torch.float32,) if run.tiny else (torch.float32, torch.bfloat16):
            sets = run.input_sets(make, size, dtype)
            harness.fresh_cache()
            jit = minicomp.jit(fn)
            with config.override(reuse_bytes=1 << 62):  # the plain order, whatever the rule says
                jit(*sets[0])  # tunes the launch config
                compiled = jit.compiled(*sets[0])
            lone = harness.lone_pointwise(compiled)
            if lone is None:
                print(f"{wname}: not one pointwise kernel launched alone: skipped", flush=True)
                continue
            call, launch, text = lone
            block, warps = launch.config or launch.heuristic()
            outer = math.prod(sets[0][0].shape[:lead])
            inner = launch.spec.numel // outer
            args = [compiled.bare_arguments(call, list(s)) for s in sets]
            floor_ms = measure.tensor_bytes(args[0]) / bandwidth * 1e3
            cases, reference = [], None
            for group in TINY_GROUPS if run.tiny else GROUPS:
                kernel, grid, name = launch.kernel, launch.grid(block), "as written"
                if group is not None:
                    (group, stretch, each), units = group, cdiv(outer, group[2])
                    group = min(group, units)
                    name = f"{group} planes side by side, {stretch} blocks a plane, {each} planes a program"
                    source = planes_grouped(text, outer, inner, block, group, stretch, each)
                    kernel = harness.kernel_from_text(source + "\n\n\n" + helpers(compiled.source), name)
                    grid = cdiv(units, group) * group * stretch * cdiv(cdiv(inner, block), stretch)
                go = lambda *a, k=kernel, g=grid: k[(g,)](*a, BLOCK_SIZE=block, num_warps=warps)  # noqa: E731
                outs = harness.written(call, args[0], go)
                reference = reference or outs
                error = harness.error_against(outs, reference)
                row = dict(
                    workload=wname,
                    dtype=str(dtype)[6:],
                    size=size,
                    variant=name,
                    group=group,
                    outer=outer,
                    inner=inner,
                    block=block,
                    warps=warps,
                    programs=grid,
                    error=error,
                    floor_ms=floor_ms,
                )
                cases.append((row, go, args))
            # a copy of half the kernel's bytes (read + written: all of them) at the same size
            half = measure.tensor_bytes(args[0]) // 2 // 4
            copies = [(torch.empty(half, device=run.device), torch.empty(half, device=run.device)) for _ in args]
            copy_row = dict(workload=wname, dtype=str(dtype)[6:], size=size, variant="copy", floor_ms=floor_ms)
            cases.append((copy_row, lambda d, s: d.copy_(s), copies))
            rows += harness.time_in_turn(run, cases, ROUNDS)
    run.write(bandwidth_gbps=bandwidth / 1e9, rounds=ROUNDS, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
