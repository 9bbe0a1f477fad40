"""Instructions per value of bfloat16 GELU, both forms, as minicomp writes them and as it did.

    python -m benchmarks.experiments.gelu_sass OUT.json

bfloat16 GELU over [8192, 8192] + bias ran 1.40x (tanh form) and 1.64x (erf form) the memory
floor on an H200, bound by arithmetic: at the floor an SM must finish about 4 values a clock,
some 30 instructions a value at most. This compiles, for sm_90 on any machine (sass_count.py's
way: Triton's ptxas and nvdisasm), minicomp's kernels for both forms next to the lowering they
replaced (libdevice's tanh; `tl.erf`, written out below the way ops/pointwise.py wrote them) and
counts SASS instructions (NOPs aside) per value a thread writes.
"""

from __future__ import annotations

import types

import torch

import minicomp
from benchmarks.experiments import harness
from benchmarks.experiments.sass_count import BLOCK, WARPS, sass
from minicomp import runtime
from minicomp.tools.workloads import gelu_erf, gelu_tanh

BEFORE = {  # the lowering of ops/pointwise.py before `_one_and` and `_erfc16`
    "gelu_tanh": "0.5 * y * (1.0 + libdevice.tanh(0.7978845608 * (y + 0.044715 * y * y * y)))",
    "gelu_erf": "0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))",
}
KERNEL = """
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def gelu_before(x_ptr, b_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    y = tl.load(x_ptr + offsets, mask=mask).to(tl.float32) + tl.load(b_ptr + offsets % 8192, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, ({}).to(tl.bfloat16), mask=mask)
"""


def generated(fn) -> types.SimpleNamespace:
    """minicomp's kernel for fn on bf16 x [2, 8192] + bias, imported compiled (not interpreted)."""
    x, b = torch.randn(2, 8192, dtype=torch.bfloat16), torch.randn(8192, dtype=torch.bfloat16)
    compiled = minicomp.jit(fn).compiled(x, b)
    module = runtime.load(compiled.source, f"gelu_sass_{fn.__name__}", interpret=False)
    return getattr(module, compiled.kernels[0].launcher)


def main(argv=None):
    run = harness.parse(argv, __doc__)
    per_thread = BLOCK // (WARPS * 32)
    rows = []
    for name, fn in (("gelu_tanh", gelu_tanh), ("gelu_erf", gelu_erf)):
        module = runtime.load(KERNEL.format(BEFORE[name]), f"gelu_sass_before_{name}", interpret=False)
        before = types.SimpleNamespace(kernel=module.gelu_before)
        for label, launch in (("before", before), ("minicomp", generated(fn))):
            lines = sass(launch, torch.bfloat16)
            rows.append(dict(workload=name, kernel=label, per_value=len(lines) / per_thread))
            print(rows[-1], flush=True)
    run.write(target="sm_90", block=BLOCK, warps=WARPS, rows=rows)


if __name__ == "__main__":
    main()
