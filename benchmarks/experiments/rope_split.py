"""RoPE kernels walked in halves (codegen/split.py) against the masked form, timed in one run.

    PYTHONPATH=. python benchmarks/experiments/rope_split.py OUT.json

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
import itertools
import json
import os
import sys
import tempfile

import torch
import triton
import triton.language as tl
import triton.testing

import minicomp
from minicomp.bench import measure
from minicomp.workloads import WORKLOADS, rope
from minicomp import config
from minicomp.codegen import families

sys.path.insert(0, "benchmarks/experiments")
from rope_backward_variants import variant  # noqa: E402

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


def rope_entry(inputs, max_parts):
    """minicomp's compiled RoPE (forward and backward modules) written with config max_parts = max_parts."""
    os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()   # nothing served from an earlier write
    with config.override(max_parts=max_parts):
        families.forget()
        fn = minicomp.jit(rope)
        entry = fn.entry(*inputs)
        torch.autograd.backward(fn(*inputs), [torch.ones_like(inputs[0])] * 2)
        return entry


def kernels_of(sets, max_parts):
    """(forward launch, backward launch) as minicomp writes them with config max_parts = max_parts."""
    entry = rope_entry(sets[0], max_parts)
    return tuple(sys.modules[getattr(entry, part).call.__module__].launch_0 for part in ("forward", "backward"))


def main(path):
    bandwidth = measure.copy_bandwidth("cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for dname, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        sets = measure.input_sets(WORKLOADS["rope_fwbw"].make, 2048, dtype, "cuda", l2)
        with torch.no_grad():
            fw_sets = [[t.detach() for t in s] for s in sets]
            bw_sets = [[s[2], s[3], torch.randn_like(s[0]), torch.randn_like(s[1])] for s in fw_sets]
        nbytes = 2 * measure.tensor_bytes(fw_sets[0][:2]) + measure.tensor_bytes(fw_sets[0][2:])
        floor = nbytes / bandwidth * 1e3
        masked, halves = kernels_of(sets, 1), kernels_of(sets, config.DEFAULTS["max_parts"])
        arrange = {"forward": lambda q, k, cos, sin: (q, cos, sin, k),
                   "backward": lambda cos, sin, g1, g2: (g2, sin, cos, g1)}
        for i, (part, part_sets) in enumerate((("forward", fw_sets), ("backward", bw_sets))):
            launches = {"masked": masked[i], "split": halves[i]}
            if dtype == torch.bfloat16:
                text = inspect.getsource(halves[i].kernel.fn).replace(".to(tl.float32)", WIDEN)
                launches["split, int widen"] = (variant(text, f"{part} widen", lambda s: s), halves[i].numel)
            launches["stream"] = (stream, masked[i].numel)
            expected = None
            for name, launch in launches.items():
                kernel, numel = (launch.kernel, launch.numel) if hasattr(launch, "kernel") else launch
                for block, warps in CONFIGS:
                    def run(*inputs, block=block, warps=warps, kernel=kernel, numel=numel):
                        args = arrange[part](*inputs)
                        out = torch.empty_like(args[0]), torch.empty_like(args[-1])
                        kernel[(triton.cdiv(numel, block),)](*args, *out, numel, BLOCK_SIZE=block, num_warps=warps)
                        return out
                    got = run(*part_sets[0])
                    if name != "stream":
                        expected = expected or got
                        torch.testing.assert_close(got, expected)
                    cycle = itertools.cycle(part_sets)
                    ms = triton.testing.do_bench(lambda: run(*next(cycle)), warmup=25, rep=200, return_mode="median")
                    rows.append(dict(dtype=dname, part=part, kernel=name, config=[block, warps], ms=ms,
                                     x_floor=ms / floor))
                    print(json.dumps(rows[-1]), flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), bandwidth_gbps=bandwidth / 1e9, rows=rows),
              open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
