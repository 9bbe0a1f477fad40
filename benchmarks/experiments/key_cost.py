"""What the signature key of a cache hit costs: `JitFunction._key` alone, in microseconds.

    python -m benchmarks.experiments.key_cost OUT.json

The key holds each argument's layout, the global modes and the Python values the function reads
(reads.py: its globals and closure cells, those of the helpers it calls). Three functions: one
reading one global module, one reading `torch` and a float, one closing over a float. Timed on the
host (the key never touches the GPU); the least of 5 rounds of 20,000 keys.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import minicomp
from benchmarks.experiments import harness

SCALE = 0.5


def reads_a_module(x, b):
    return F.gelu(x) + b


def reads_torch_and_a_float(x, b):
    return torch.relu(x + SCALE * x * b + b)


def _closing(factor):
    return lambda x, b: x * factor + b


def main(argv=None):
    run = harness.parse(argv, __doc__)
    x, b = torch.randn(64, device=run.device), torch.randn(64, device=run.device)
    rows = []
    for name, fn in (
        ("reads F", reads_a_module),
        ("reads torch, SCALE", reads_torch_and_a_float),
        ("closes over a float", _closing(2.0)),
    ):
        jitted = minicomp.jit(fn)
        jitted(x, b)
        leaves, spec = jitted._flatten((x, b), {})
        keys = 2000 if run.tiny else 20000
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(keys):
                jitted._key(leaves, spec)
            best = min(best, (time.perf_counter() - start) / keys * 1e6)
        rows.append(dict(function=name, key_us=best))
        print(f"{name:22s} key {best:.3f} us")
    run.write(rows=rows)


if __name__ == "__main__":
    main()
