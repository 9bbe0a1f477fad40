"""What a norm's forward + backward takes when its traffic streams at best: the reference for issue #16's
"1.25x the floor" goal.

    python -m benchmarks.experiments.norm_traffic OUT.json

A norm's training step must move, at the least: the forward reads x and writes y; the backward reads x
again and dy, writes dx (w, dW and the per-row statistics are a few KiB). The bench's floor counts each
tensor once (x, y, dy, dx: 4 rows of x's bytes) over the measured copy bandwidth, so a step that reads
x twice at exactly that bandwidth takes 5 / 4 = 1.25x the floor. This times kernels with no math that
move the same bytes the same way, on x of [32768, 4096] (the bench's headline) in float32 and bf16:

- `read 1, write 1` (the forward's traffic): `y = x * 2` as a plain Triton kernel over flat blocks
  (BLOCK x warps swept, the least kept), eager `torch.mul(x, 2, out=y)` and `y.copy_(x)`;
- `read 2, write 1` (the backward's): `dx = x + dy`, the same ways;
- `both in turn`: the fastest of each run back to back in one timed call, the least such a step
  could take from kernels that stream at the speed measured here;
- the workloads themselves (`rms_norm_fwbw`, `layer_norm_fwbw`) through minicomp and Inductor, timed as
  `minicomp bench` times them, in the same process.

Every row is `ms` (do_bench: an L2 flush before each run, input sets rotated) and `x_floor` over the
norm step's floor (the bench's: each input, output and gradient once).
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

import minicomp
from benchmarks.experiments import harness
from minicomp.bench import measure
from minicomp.tools.workloads import WORKLOADS


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # y = x * 2: read one, write one
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)


@triton.jit
def _add(x_ptr, d_ptr, y_ptr, n, BLOCK: tl.constexpr):  # y = x + d: read two, write one
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(d_ptr + offsets, mask=mask), mask=mask)


CONFIGS = [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 8)]
TINY_CONFIGS = [(1024, 1)]
ROUNDS = 3


def _triton(kernel, block: int, warps: int):
    def go(*tensors):
        n = tensors[0].numel()
        kernel[(triton.cdiv(n, block),)](*tensors, n, BLOCK=block, num_warps=warps)

    return go


def streams(run, rows: int, width: int, dtype) -> tuple[list, list]:
    """(cases, input sets): the streaming kernels of both kinds (kind, how, run, tensors read), and
    rotating sets of [x, dy, out]."""
    count = 1 if run.tiny else 4  # 4 sets of 3 tensors of 256-512 MiB: far past the L2 either way
    sets = [[torch.randn(rows, width, dtype=dtype, device=run.device) for _ in range(3)] for _ in range(count)]
    configs = TINY_CONFIGS if run.tiny else CONFIGS
    cases = []
    for block, warps in configs:
        cases.append(("read 1, write 1", f"triton {block}x{warps}", _triton(_scale, block, warps), 1))
        cases.append(("read 2, write 1", f"triton {block}x{warps}", _triton(_add, block, warps), 2))
    cases += [
        ("read 1, write 1", "torch.mul(out=)", lambda x, y: torch.mul(x, 2, out=y), 1),
        ("read 1, write 1", "copy_", lambda x, y: y.copy_(x), 1),
        ("read 2, write 1", "torch.add(out=)", lambda x, d, y: torch.add(x, d, out=y), 2),
    ]
    return cases, sets


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows, width = (64, 256) if run.tiny else (32768, 4096)
    results = []
    for dtype in (torch.float32,) if run.tiny else (torch.float32, torch.bfloat16):
        # the step's floor: x, y, dy, dx of [rows, width] and w, dW of [width] (the bench's, for RMSNorm)
        floor_ms = (4 * rows * width + 2 * width) * dtype.itemsize / bandwidth * 1e3
        cases, sets = streams(run, rows, width, dtype)
        best = {}
        timed = []
        for kind, how, go, reads in cases:
            args_sets = [s[:reads] + [s[2]] for s in sets]
            row = dict(dtype=str(dtype), kind=kind, how=how, floor_ms=floor_ms)
            timed.append((row, go, args_sets))
        harness.time_in_turn(run, timed, ROUNDS)
        for row, go, _ in timed:
            if row["kind"] not in best or row["ms"] < best[row["kind"]][0]["ms"]:
                best[row["kind"]] = (row, go)
            results.append(row)
        forward, backward = best["read 1, write 1"][1], best["read 2, write 1"][1]
        both = dict(
            dtype=str(dtype),
            kind="both in turn",
            how=f"{best['read 1, write 1'][0]['how']}, then {best['read 2, write 1'][0]['how']}",
            floor_ms=floor_ms,
        )
        harness.time_in_turn(run, [(both, lambda x, d, y: (forward(x, y), backward(x, d, y)), sets)], ROUNDS)
        results.append(both)
        if run.tiny:
            continue  # the workloads at their sizes: the GPU run only
        for wname in ("rms_norm_fwbw", "layer_norm_fwbw"):
            work = WORKLOADS[wname]
            work_sets = run.input_sets(work.make, rows, dtype)
            outputs = work.fn(*work_sets[0])
            work_floor = measure.floor_bytes(work_sets[0], [outputs], backward=True) / bandwidth * 1e3
            for name, fn in (("minicomp", minicomp.jit(work.fn)), ("inductor", torch.compile(work.fn))):
                row = dict(dtype=str(dtype), kind=wname, how=name, floor_ms=work_floor)
                row["ms"] = min(run.time_ms(fn, work_sets, backward=True) for _ in range(ROUNDS))
                row["x_floor"] = row["ms"] / row["floor_ms"]
                print(row, flush=True)
                results.append(row)
    run.write(rows=rows, width=width, bandwidth_gbps=bandwidth / 1e9, rounds=ROUNDS, results=results)


if __name__ == "__main__":
    main(sys.argv[1:])
