"""What the decoder block's forward saves for its backward: minicomp's partition against Inductor's.

    python -m benchmarks.experiments.saved_tensors OUT.json

Runs the bench's `llama_block_fwbw` forward (bf16, B=4, S=2048, d=2048, 4 k/v heads; S=8
float32 with --tiny) through `torch.compile` with Inductor and with minicomp's backend, under
`torch.autograd.graph.saved_tensors_hooks`, which sees every tensor a compiled autograd
function saves. Per compiler: the count, the bytes, and each saved tensor's shape and dtype
(weights included: a saved input costs nothing extra). Issue #16 asks for peak memory at or
below Inductor's; equal saved bytes put a difference in the transient buffers instead.
"""

from __future__ import annotations

import torch

import minicomp.dispatch.dynamo
from benchmarks.experiments import harness
from minicomp.tools.workloads import WORKLOADS, llama_block


def saved(fn, inputs) -> list[dict]:
    found = []

    def pack(t):
        found.append(dict(shape=list(t.shape), dtype=str(t.dtype), bytes=t.numel() * t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sorted(found, key=lambda r: -r["bytes"])


def main(argv=None):
    run = harness.parse(argv, __doc__)
    seq, dtype = (8, torch.float32) if run.tiny else (2048, torch.bfloat16)
    inputs = WORKLOADS["llama_block_fwbw"].make(seq, dtype, torch.device(run.device))
    rows = []
    backends = [("minicomp", minicomp.dispatch.dynamo.backend)] + ([] if run.tiny else [("inductor", "inductor")])
    for name, backend in backends:  # (tiny: Inductor's CPU compile of the block takes minutes)
        torch._dynamo.reset()
        fn = torch.compile(llama_block, backend=backend)
        fn(*inputs)  # compiles
        tensors = saved(fn, inputs)
        rows.append(dict(impl=name, count=len(tensors), mib=sum(t["bytes"] for t in tensors) / 2**20, saved=tensors))
        print(name, rows[-1]["count"], f"{rows[-1]['mib']:.1f} MiB", flush=True)
    run.write(rows=rows)


if __name__ == "__main__":
    main()
