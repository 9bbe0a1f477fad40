"""Where a Llama-style decoder block spends its time: each GPU kernel, minicomp vs Inductor.

    python -m benchmarks.experiments.block_profile OUT.json

Runs the bench's `llama_block` workload (bf16, B=4, S=2048, d=2048; inference)
through `torch.compile(backend="minicomp")` and through Inductor, and records
torch.profiler's CUDA time per kernel name over a few calls, plus minicomp's
plan (which ops run as ATen calls, which as generated kernels). The totals
say which kernels make up a difference between the two. With BLOCK_STEP=train
in the environment: `llama_block_fwbw`, a training step (forward + backward,
4 k/v heads) instead, and the plans of its forward and backward.
"""

from __future__ import annotations

import os

import torch

import minicomp
import minicomp.dynamo
from benchmarks.experiments import harness
from minicomp.workloads import WORKLOADS, llama_block


def kernel_times(fn, inputs, calls: int, device: str) -> dict[str, float]:
    """Microseconds per call of each kernel (CPU ops on the tiny run), by name."""
    for _ in range(3):
        fn(*inputs)
    activity = torch.profiler.ProfilerActivity.CUDA if device == "cuda" else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(calls):
            fn(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        us = event.device_time_total if device == "cuda" else event.cpu_time_total
        if us > 0:
            times[event.key[:120]] = times.get(event.key[:120], 0.0) + us / calls
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def training_step(fn):
    """forward + backward with a fixed output gradient; gradients reset, as the bench does."""

    def step(*inputs):
        out = fn(*inputs)
        out.backward(torch.ones_like(out))
        for t in inputs:
            t.grad = None

    return step


def main(argv=None):
    run = harness.parse(argv, __doc__)
    train = os.environ.get("BLOCK_STEP") == "train"
    seq, dtype = (8, torch.float32) if run.tiny else (2048, torch.bfloat16)
    inputs = WORKLOADS["llama_block_fwbw" if train else "llama_block"].make(seq, dtype, run.device)
    torch._dynamo.reset()
    result, rows = {}, []
    for impl in ("minicomp", "inductor"):
        backend = minicomp.dynamo.backend if impl == "minicomp" else "inductor"
        fn = torch.compile(llama_block, backend=backend)
        with torch.set_grad_enabled(train):
            times = kernel_times(training_step(fn) if train else fn, inputs, 1 if run.tiny else 10, run.device)
        result[impl] = dict(total_us=sum(times.values()), kernels=times)
        rows += [dict(impl=impl, kernel=name, us=us) for name, us in times.items()]
    jit = minicomp.jit(llama_block)
    if train:
        training_step(jit)(*inputs)
        entry = jit.entry(*inputs)
        result["minicomp_plan"] = str(entry.forward.plan).splitlines() + str(entry.backward.plan).splitlines()
    else:
        result["minicomp_plan"] = str(jit.compiled(*inputs).plan).splitlines()
    run.write(seq=seq, dtype=str(dtype), rows=rows, **result)
    for impl in ("minicomp", "inductor"):
        print(f"{impl}: {result[impl]['total_us']:.1f} us per call")
        for name, us in list(result[impl]["kernels"].items())[:14]:
            print(f"  {us:9.1f}  {name}")


if __name__ == "__main__":
    main()
