"""`minicomp demo`: compile the seed workloads, check them against eager, show the code.

Runs on the GPU when there is one, else on the CPU through Triton's interpreter.
"""

from __future__ import annotations

import re
import time

import torch

from minicomp.dispatch.jit import jit
from minicomp.tools.workloads import WORKLOADS


def main(argv=None) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = device.type == "cpu"
    print(f"minicomp demo on {device} ({'Triton interpreter' if small else torch.cuda.get_device_name()})\n")
    failures = 0
    for name in ("gelu_tanh", "gelu_erf", "bias_relu", "lora_epilogue", "swiglu", "rope_fw"):
        work = WORKLOADS[name]
        size = 8 if small else work.sizes[-1]
        inputs = (
            work.make(size, torch.float32, device)
            if name != "rope_fw"
            else work.make(16 if small else 2048, torch.float32, device)
        )
        if small and name != "rope_fw":
            inputs = [t[..., :96].contiguous() for t in inputs]
        compiled = jit(work.fn)
        start = time.perf_counter()
        got = compiled(*inputs)
        first = time.perf_counter() - start
        expected = work.fn(*inputs)
        ok = all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(_flat(got), _flat(expected)))
        failures += not ok
        kernels = len(re.findall(r"^@triton\.jit", compiled.source(*inputs), flags=re.M))
        shapes = ", ".join(str(list(t.shape)) for t in inputs)
        status = "ok " if ok else "BAD"
        print(f"{status} {name:14s} {kernels} kernel(s)  first call {first * 1e3:7.1f} ms  inputs {shapes}")
    q, k, cos, sin = WORKLOADS["rope_fw"].make(16, torch.float32, device)
    rope = jit(WORKLOADS["rope_fw"].fn)
    print("\nThe generated module for RoPE (q and k rotated in one kernel):\n")
    print(rope.source(q[:1, :2], k[:1, :2], cos, sin))
    return 1 if failures else 0


def _flat(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]
