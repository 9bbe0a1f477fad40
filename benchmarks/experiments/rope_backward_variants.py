"""Why the RoPE backward kernel runs slower than the forward: variants of its text, timed.

    PYTHONPATH=. python benchmarks/experiments/rope_backward_variants.py OUT.json

q, k of [8, 32, 2048, 128] in bfloat16 and float32. `generated` is minicomp's
backward kernel as emitted; `loads first` moves its full-row loads (tangents
at `offsets`, cos) ahead of the half-row ones, the order the forward kernel
has; `eviction hints` marks the cos/sin loads evict_last and the streamed
tangent loads evict_first; `select` is a hand-written kernel that computes the
same gradient with one select per output, the forward's shape (a measurement
aid: minicomp never emits it). Each as a multiple of the memory floor, at the
launch configuration minicomp tuned for the generated kernel.

This studies the masked form of the kernel, from before codegen/split.py:
splitting is switched off here (config.override(max_parts=1)) so that it still does.
rope_split.py compares the masked and the split kernels.
"""
import importlib.util
import inspect
import itertools
import json
import re
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


@triton.jit
def rope_backward_select(g2_ptr, sin_ptr, cos_ptr, g1_ptr, out0_ptr, out1_ptr, n_elements,
                         BLOCK_SIZE: tl.constexpr):
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


def variant(kernel_source: str, name: str, transform):
    """Import `transform(kernel_source)` as a kernel (Triton reads source from a file)."""
    text = "import triton\nimport triton.language as tl\n\n" + transform(kernel_source)
    path = tempfile.NamedTemporaryFile("w", suffix=f"_{name.replace(' ', '_')}.py", delete=False)
    path.write(text)
    path.close()
    spec = importlib.util.spec_from_file_location(f"variant_{abs(hash(text))}", path.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, re.search(r"^def (\w+)", kernel_source, re.M).group(1))


def loads_first(source: str) -> str:
    lines = source.splitlines()
    body = [i for i, line in enumerate(lines) if line.startswith("    ")]
    full = [i for i in body if re.search(r"tl\.load\(\w+_ptr \+ (offsets|\(\(offsets % \d+\)\)),", lines[i])]
    anchor = next(i for i in body if lines[i].strip().startswith("x3 ="))
    moved = [lines[i] for i in full]
    rest = [line for i, line in enumerate(lines) if i not in full]
    at = rest.index(lines[anchor]) + 1
    return "\n".join(rest[:at] + moved + rest[at:])


def eviction_hints(source: str) -> str:
    def hint(match):
        policy = "evict_last" if match.group(1).startswith("primals") else "evict_first"
        return f"tl.load({match.group(1)}_ptr{match.group(2)}, other=0, eviction_policy=\"{policy}\")"
    return re.sub(r"tl\.load\((\w+)_ptr(.*?), other=0\)", hint, source)


def main(path):
    with config.override(max_parts=1):   # the masked kernel this experiment is about
        measure_variants(path)


def measure_variants(path):
    bandwidth = measure.copy_bandwidth("cuda")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for dname, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        sets = measure.input_sets(WORKLOADS["rope_fwbw"].make, 2048, dtype, "cuda", l2)
        fn = minicomp.jit(rope)
        entry = fn.entry(*sets[0])
        torch.autograd.backward(fn(*sets[0]), [torch.ones_like(sets[0][0])] * 2)  # compiles the backward
        with torch.no_grad():
            bw_sets = [[s[2], s[3], torch.randn_like(s[0]), torch.randn_like(s[1])] for s in sets]
        floor = (2 * measure.tensor_bytes(bw_sets[0][2:]) + measure.tensor_bytes(bw_sets[0][:2])) / bandwidth * 1e3
        launch = sys.modules[entry.backward.call.__module__].launch_0
        block, warps = launch.config
        source = inspect.getsource(launch.kernel.fn)   # with its @triton.jit line
        kernels = {"generated": launch.kernel,
                   "loads first": variant(source, "loads first", loads_first),
                   "eviction hints": variant(source, "eviction hints", eviction_hints),
                   "select": rope_backward_select}
        expected = None
        for name, kernel in kernels.items():
            def run(cos, sin, g1, g2, kernel=kernel):
                out = torch.empty_like(g1), torch.empty_like(g2)
                kernel[(launch.grid(block),)](g2, sin, cos, g1, *out, launch.numel, BLOCK_SIZE=block,
                                              num_warps=warps)
                return out
            got = run(*bw_sets[0])
            expected = expected or got
            torch.testing.assert_close(got, expected)
            cycle = itertools.cycle(bw_sets)
            ms = triton.testing.do_bench(lambda: run(*next(cycle)), warmup=25, rep=200, return_mode="median")
            rows.append(dict(dtype=dname, kernel=name, config=[block, warps], ms=ms, x_floor=ms / floor))
            print(rows[-1], flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), bandwidth_gbps=bandwidth / 1e9, rows=rows),
              open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
