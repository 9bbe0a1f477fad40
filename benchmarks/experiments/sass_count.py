"""Instructions per element of the RoPE kernels, from their SASS, without a GPU.

    python -m benchmarks.experiments.sass_count OUT.json

Triton compiles for a target it is told (sm_90 here) on any machine: its
wheel carries ptxas and nvdisasm. For q, k of [8, 32, 2048, 128] in float32
and bfloat16, the forward and backward kernels as minicomp writes them with
and without walking the head dim in halves (codegen/parts.py), compiled at
BLOCK_SIZE 512 and 4 warps: SASS instructions (NOPs aside) divided by the
elements one thread writes.
"""

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.experiments import harness
from minicomp import config, runtime
from minicomp.tools.workloads import WORKLOADS

BLOCK, WARPS = 512, 4
NVDISASM = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def sass(launch, dtype, block: int = BLOCK) -> list[str]:
    fn = launch.kernel
    names = fn.arg_names
    signature = {
        n: "constexpr" if n == "BLOCK_SIZE" else "*" + TRITON_TYPES[dtype] if n.endswith("_ptr") else "i32"
        for n in names
    }
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n != "BLOCK_SIZE"}
    compiled = triton.compile(
        ASTSource(fn, signature, constexprs={"BLOCK_SIZE": block}, attrs=aligned),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=WARPS),
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        text = subprocess.check_output([str(NVDISASM), "-c", cubin.name], text=True)
    return [line for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line) and "NOP" not in line]


def opcodes(lines: list[str], modifiers: bool = False) -> collections.Counter:
    """How many of each SASS opcode (`LDG`, or with its modifiers `LDG.E.128`) the lines hold."""
    pattern = r"\*/\s+(?:@!?P\w+\s+)?([A-Z0-9_.]+)" if modifiers else r"\*/\s+(?:@!?P\w+\s+)?([A-Z0-9_]+)"
    return collections.Counter(re.search(pattern, line).group(1) for line in lines)


def kernels(run, dtype, max_parts):
    make = run.rope_inputs() if run.tiny else WORKLOADS["rope_fwbw"].make
    modules = harness.rope_modules(make(8 if run.tiny else 2048, dtype, "cpu"), max_parts)
    # the modules were imported for Triton's interpreter (CPU tensors): import their text compiled
    result = {}
    for part, compiled in zip(("forward", "backward"), modules):
        module = runtime.load(compiled.source, f"sass_{part}", interpret=False)
        result[part] = getattr(module, compiled.kernels[0].launcher)
    return result


def main(argv=None):
    run = harness.parse(argv, __doc__)
    threads = WARPS * 32
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for label, max_parts in (("masked", 1), ("split", config.DEFAULTS["max_parts"])):
            for part, launch in kernels(run, dtype, max_parts).items():
                lines = sass(launch, dtype)
                per_thread = BLOCK * launch.spec.parts // threads
                ops = opcodes(lines)
                rows.append(
                    dict(
                        dtype=str(dtype)[6:],
                        part=part,
                        kernel=label,
                        instructions=len(lines),
                        per_element=len(lines) / per_thread,
                        top=dict(ops.most_common(6)),
                    )
                )
                print(rows[-1], flush=True)
    run.write(target="sm_90", block=BLOCK, warps=WARPS, rows=rows)


if __name__ == "__main__":
    main(sys.argv[1:])
