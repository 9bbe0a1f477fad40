"""Why the RoPE backward kernel runs slower than the forward: variants of its text, timed.

    python -m benchmarks.experiments.rope_backward_variants OUT.json

q, k of [8, 32, 2048, 128] in bfloat16 and float32. `generated` is minicomp's
backward kernel as emitted; `loads first` moves its full-row loads (tangents
at `offsets`, cos) ahead of the half-row ones, the order the forward kernel
has; `eviction hints` marks the cos/sin loads evict_last and the streamed
tangent loads evict_first; `select` is a hand-written kernel that computes the
same gradient with one select per output, the forward's shape (a measurement
aid: minicomp never emits it). Each as a multiple of the memory floor, at the
launch configuration minicomp tuned for the generated kernel.

This studies the masked form of the kernel, from before codegen/parts.py:
splitting is switched off here (config max_parts = 1) so that it still does.
rope_split.py compares the masked and the split kernels.
"""

import inspect
import re
import sys

import torch
import triton
import triton.language as tl

from benchmarks.experiments import harness


@triton.jit
def rope_backward_select(g2_ptr, sin_ptr, cos_ptr, g1_ptr, out0_ptr, out1_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x3 = offsets % 128
    t = offsets % 262144
    low = x3 < 64
    cos = tl.load(cos_ptr + t, mask=mask, other=0).to(tl.float32)
    sin_hi = tl.load(sin_ptr + (t + 64), mask=mask & low, other=0).to(tl.float32)
    sin_lo = tl.load(sin_ptr + (t - 64), mask=mask & (x3 >= 64), other=0).to(tl.float32)
    _select_one(g2_ptr, out0_ptr, offsets, mask, low, x3, cos, sin_hi, sin_lo)
    _select_one(g1_ptr, out1_ptr, offsets, mask, low, x3, cos, sin_hi, sin_lo)


@triton.jit
def _select_one(g_ptr, out_ptr, offsets, mask, low, x3, cos, sin_hi, sin_lo):
    g = tl.load(g_ptr + offsets, mask=mask, other=0).to(tl.float32)
    g_hi = tl.load(g_ptr + (offsets + 64), mask=mask & low, other=0).to(tl.float32)
    g_lo = tl.load(g_ptr + (offsets - 64), mask=mask & (x3 >= 64), other=0).to(tl.float32)
    rotated = tl.where(low, g_hi * sin_hi, -(g_lo * sin_lo))
    tl.store(out_ptr + offsets, (g * cos + rotated).to(out_ptr.dtype.element_ty), mask=mask)


def loads_first(source: str) -> str:
    lines = source.splitlines()
    body = [i for i, line in enumerate(lines) if line.startswith("    ")]
    full = [i for i in body if re.search(r"tl\.load\(\w+_ptr \+ (offsets|\(\(offsets % \d+\)\)),", lines[i])]
    anchor = [i for i in body if re.match(r"\s+x\d+ = ", lines[i])][-1]  # after the index variables
    moved = [lines[i] for i in full]
    rest = [line for i, line in enumerate(lines) if i not in full]
    at = rest.index(lines[anchor]) + 1
    return "\n".join(rest[:at] + moved + rest[at:])


def eviction_hints(source: str) -> str:
    def hint(match):
        policy = "evict_last" if match.group(1).startswith("primals") else "evict_first"
        return f'tl.load({match.group(1)}_ptr{match.group(2)}, other=0, eviction_policy="{policy}")'

    return re.sub(r"tl\.load\((\w+)_ptr(.*?), other=0\)", hint, source)


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows = []
    for dname, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        sets = run.input_sets(run.rope_inputs(), 8 if run.tiny else 2048, dtype)
        _, backward = harness.rope_modules(sets[0], max_parts=1)  # the masked kernel this is about
        with torch.no_grad():  # the backward graph's inputs: what the forward saved, one gradient per output
            bw_sets = [[s[2], s[3], torch.randn_like(s[0]), torch.randn_like(s[1])] for s in sets]
        floor = (2 * measure_bytes(bw_sets[0][2:]) + measure_bytes(bw_sets[0][:2])) / bandwidth * 1e3
        launch_bare = harness.bare(backward)
        block, warps = launch_bare.launch.config or (1024, 4)
        source = inspect.getsource(launch_bare.launch.kernel.fn)  # with its @triton.jit line
        kernels = {
            "generated": None,
            "loads first": harness.kernel_from_text(source, "loads first", loads_first),
            "eviction hints": harness.kernel_from_text(source, "eviction hints", eviction_hints),
        }
        order = [backward.graph.inputs.index(b) for b in backward.kernels[0].buffers[:4]]
        if not run.tiny and order == [3, 1, 0, 2]:  # written for [.., 2048, 128], parameters (g2, sin, cos, g1)
            kernels["select"] = rope_backward_select
        expected = None
        for name, kernel in kernels.items():

            def once(*inputs, kernel=kernel):
                return launch_bare(*inputs, block=block, warps=warps, kernel=kernel)

            got = once(*bw_sets[0])
            expected = expected or got
            torch.testing.assert_close(got, expected)
            ms = run.bench(once, bw_sets)
            rows.append(dict(dtype=dname, kernel=name, config=[block, warps], ms=ms, x_floor=ms / floor))
            print(rows[-1], flush=True)
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows)


def measure_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


if __name__ == "__main__":
    main(sys.argv[1:])
