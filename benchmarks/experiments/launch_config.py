"""Launch configurations of the generated kernels (and one hand-split RoPE reference), timed.

    python -m benchmarks.experiments.launch_config OUT.json

For each headline workload and dtype, minicomp's module runs with each
(BLOCK_SIZE, num_warps) as its only launch candidate (config.override, a fresh
cache each time) and is timed the way `minicomp bench` times (median of
do_bench over input sets that rotate past L2), as a multiple of the memory
floor, beside Inductor. The reference `split-halves` is a hand-written Triton
kernel that reads each half of the head dim as its own block (no masks, no
select): how close to the floor RoPE can get on this GPU. A measurement aid
only; minicomp never emits it. launch.py's defaults come from this sweep.
"""

import sys

import torch
import triton
import triton.language as tl

import minicomp
from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure
from minicomp.tools.workloads import WORKLOADS

CONFIGS = [(512, 4), (1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (8192, 8)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@triton.jit
def rope_split_halves(
    q_ptr, k_ptr, cos_ptr, sin_ptr, oq_ptr, ok_ptr, rows, S: tl.constexpr, HALF: tl.constexpr, ROWS: tl.constexpr
):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # rows of [B*H*S, 2*HALF]
    c = tl.arange(0, HALF)[None, :]
    m = r < rows
    base = r * (2 * HALF)
    t = (r % S) * (2 * HALF)
    c1 = tl.load(cos_ptr + t + c, mask=m).to(tl.float32)
    c2 = tl.load(cos_ptr + t + HALF + c, mask=m).to(tl.float32)
    s1 = tl.load(sin_ptr + t + c, mask=m).to(tl.float32)
    s2 = tl.load(sin_ptr + t + HALF + c, mask=m).to(tl.float32)
    _rotate_half_rows(q_ptr, oq_ptr, base, c, m, c1, c2, s1, s2, HALF)
    _rotate_half_rows(k_ptr, ok_ptr, base, c, m, c1, c2, s1, s2, HALF)


@triton.jit
def _rotate_half_rows(x_ptr, o_ptr, base, c, m, c1, c2, s1, s2, HALF: tl.constexpr):
    x1 = tl.load(x_ptr + base + c, mask=m).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + c, mask=m).to(tl.float32)
    tl.store(o_ptr + base + c, (x1 * c1 - x2 * s1).to(o_ptr.dtype.element_ty), mask=m)
    tl.store(o_ptr + base + HALF + c, (x2 * c2 + x1 * s2).to(o_ptr.dtype.element_ty), mask=m)


def split_halves(rows_per_program, warps):
    def run(q, k, cos, sin):
        oq, ok = torch.empty_like(q), torch.empty_like(k)
        rows = q.numel() // q.shape[-1]
        grid = (triton.cdiv(rows, rows_per_program),)
        rope_split_halves[grid](
            q, k, cos, sin, oq, ok, rows, q.shape[-2], q.shape[-1] // 2, rows_per_program, num_warps=warps
        )
        return oq, ok

    return run


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows = []
    for wname in ["rope_fw", "gelu_tanh", "bias_relu", "lora_epilogue", "swiglu"]:
        work = WORKLOADS[wname]
        for dname, dtype in DTYPES.items():
            sets = run.input_sets(work.make, 8 if run.tiny else work.sizes[-1], dtype)
            moved = measure.floor_bytes(sets[0], measure.flat_tensors(work.fn(*sets[0])), work.backward)
            floor = moved / bandwidth * 1e3

            def record(impl, fn, **extra):
                ms = run.time_ms(fn, sets, work.backward)
                rows.append(dict(workload=wname, dtype=dname, impl=impl, ms=ms, x_floor=ms / floor, **extra))
                print(rows[-1], flush=True)

            if not run.tiny:
                record("inductor", torch.compile(work.fn))
            for block, warps in CONFIGS[:1] if run.tiny else CONFIGS:
                harness.fresh_cache()
                with config.override(launch_candidates=[(block, warps)], tune_min_numel=0):
                    fn = minicomp.jit(work.fn)
                    fn(*sets[0])  # chooses its (only) configuration
                record("minicomp", fn, block=block, warps=warps)
            if wname == "rope_fw":
                for rpp, warps in [(8, 4)] if run.tiny else [(8, 4), (16, 4), (32, 4), (32, 8)]:
                    record("split-halves", split_halves(rpp, warps), block=rpp * 128, warps=warps)
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
