"""RoPE kernels walked in halves (codegen/parts.py) against the masked form, timed in one run.

    python -m benchmarks.experiments.rope_split OUT.json

q, k of [8, 32, 2048, 128], float32 and bfloat16, forward and backward
kernels, each as a multiple of the memory floor at several launch configs:
  * `masked`: the kernel as written without splitting (config max_parts = 1):
    rotate_half as two half-masked loads and a select;
  * `split`: the head dim walked as two parts of 64, as minicomp generates it;
  * `split, int widen` (bf16): each bf16 load widened as `bits << 16`
    bitcast to float32 instead of `.to(tl.float32)` (Triton's conversion
    takes two instructions for every second element);
  * `stream`: a reference with the same bytes and no rotation, out = q * cos
    and k * sin: what this traffic costs at best from Triton.
"""

import inspect
import sys

import torch
import triton
import triton.language as tl

from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure

CONFIGS = [(256, 2), (256, 4), (512, 4), (1024, 4), (512, 8), (1024, 8)]
WIDEN = ".to(tl.uint16, bitcast=True).to(tl.uint32).__lshift__(16).to(tl.float32, bitcast=True)"


@triton.jit
def stream(a_ptr, b_ptr, c_ptr, d_ptr, out0_ptr, out1_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask, other=0).to(tl.float32)
    b = tl.load(b_ptr + (offsets % 262144), mask=mask, other=0).to(tl.float32)
    c = tl.load(c_ptr + (offsets % 262144), mask=mask, other=0).to(tl.float32)
    d = tl.load(d_ptr + offsets, mask=mask, other=0).to(tl.float32)
    tl.store(out0_ptr + offsets, (a * b).to(out0_ptr.dtype.element_ty), mask=mask)
    tl.store(out1_ptr + offsets, (d * c).to(out1_ptr.dtype.element_ty), mask=mask)


def main(argv=None):
    run = harness.parse(argv, __doc__)
    bandwidth = run.bandwidth()
    rows = []
    for dname, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        sets = run.input_sets(run.rope_inputs(), 8 if run.tiny else 2048, dtype)
        with torch.no_grad():
            fw_sets = [[t.detach() for t in s] for s in sets]
            bw_sets = [[s[2], s[3], torch.randn_like(s[0]), torch.randn_like(s[1])] for s in fw_sets]
        nbytes = 2 * measure.tensor_bytes(fw_sets[0][:2]) + measure.tensor_bytes(fw_sets[0][2:])
        floor = nbytes / bandwidth * 1e3
        masked = harness.rope_modules(sets[0], max_parts=1)
        halves = harness.rope_modules(sets[0], max_parts=config.DEFAULTS["max_parts"])
        for i, (part, part_sets) in enumerate((("forward", fw_sets), ("backward", bw_sets))):
            launches = {"masked": (harness.bare(masked[i]), None), "split": (harness.bare(halves[i]), None)}
            if dtype == torch.bfloat16:
                text = inspect.getsource(launches["split"][0].launch.kernel.fn).replace(".to(tl.float32)", WIDEN)
                launches["split, int widen"] = (launches["split"][0], harness.kernel_from_text(text, f"{part} widen"))
            expected = None
            for name, (launch_bare, kernel) in launches.items():
                for block, warps in CONFIGS[:1] if run.tiny else CONFIGS:

                    def once(*inputs, block=block, warps=warps, launch_bare=launch_bare, kernel=kernel):
                        return launch_bare(*inputs, block=block, warps=warps, kernel=kernel)

                    got = once(*part_sets[0])
                    expected = expected or got
                    torch.testing.assert_close(got, expected)
                    ms = run.bench(once, part_sets)
                    rows.append(
                        dict(dtype=dname, part=part, kernel=name, config=[block, warps], ms=ms, x_floor=ms / floor)
                    )
                    print(rows[-1], flush=True)
            if not run.tiny:  # the stream reference is written for [.., 2048, 128]
                for block, warps in CONFIGS:

                    def streamed(a, b, c, d, block=block, warps=warps):
                        out = torch.empty_like(a), torch.empty_like(d)
                        stream[(triton.cdiv(a.numel(), block),)](
                            a, b, c, d, *out, a.numel(), BLOCK_SIZE=block, num_warps=warps
                        )
                        return out

                    arranged = (
                        [[s[0], s[2], s[3], s[1]] for s in fw_sets]
                        if part == "forward"
                        else [[s[3], s[1], s[0], s[2]] for s in bw_sets]
                    )  # (q, cos, sin, k) and (g2, sin, cos, g1)
                    ms = run.bench(streamed, arranged)
                    rows.append(
                        dict(dtype=dname, part=part, kernel="stream", config=[block, warps], ms=ms, x_floor=ms / floor)
                    )
    run.write(bandwidth_gbps=bandwidth / 1e9, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
