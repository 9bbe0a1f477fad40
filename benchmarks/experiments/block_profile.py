"""Where a Llama-style decoder block spends its time: each GPU kernel, minicomp vs Inductor.

    python -m benchmarks.experiments.block_profile OUT.json

Runs the bench's `llama_block` workload (bf16, B=4, S=2048, d=2048; inference)
through `torch.compile(backend="minicomp")` and through Inductor, and records
torch.profiler's CUDA time per kernel name over a few calls, plus minicomp's
plan (which ops run as ATen calls, which as generated kernels). The totals
say which kernels make up a difference between the two; `idle` says how long the
GPU waited between kernels, and where (the largest gaps). With BLOCK_STEP=train
in the environment: `llama_block_fwbw`, a training step (forward + backward,
4 k/v heads) instead, and the plans of its forward and backward. With PROFILE_WORKLOAD (and
PROFILE_SIZE, PROFILE_DTYPE): any bench workload instead of the block (a training step where the
workload is one), e.g. `PROFILE_WORKLOAD=rms_norm_fwbw PROFILE_SIZE=32768`.
"""

from __future__ import annotations

import os

import torch

import minicomp
import minicomp.dispatch.dynamo
from benchmarks.experiments import harness
from minicomp.tools.workloads import WORKLOADS


def kernel_times(fn, inputs, calls: int, device: str) -> tuple[dict[str, float], dict]:
    """(microseconds per call of each kernel by name (CPU ops on the tiny run), the GPU's idle
    time between kernels: `idle`)."""
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
    return dict(sorted(times.items(), key=lambda kv: -kv[1])), idle(prof, calls, device)


def idle(prof, calls: int, device: str, gap_us: float = 2.0) -> dict:
    """How long the GPU waited between kernels, per call: the span from the first kernel's start
    to the last one's end, the time kernels ran, and the gaps of more than `gap_us` named by the
    kernels on either side (summed over the calls, largest first): where Python and the
    launches, not the GPU, set the pace."""
    if device != "cuda":
        return {}
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    if not kernels:
        return {}
    gaps: dict[str, float] = {}
    busy, end = 0.0, kernels[0].time_range.start
    for before, after in zip([None] + kernels, kernels):
        start = after.time_range.start
        if before is not None and start - end > gap_us:
            key = f"{before.name[:50]} -> {after.name[:50]}"
            gaps[key] = gaps.get(key, 0.0) + (start - end) / calls
        busy += after.time_range.end - max(start, end) if after.time_range.end > end else 0.0
        end = max(end, after.time_range.end)
    span = (end - kernels[0].time_range.start) / calls
    top = dict(sorted(gaps.items(), key=lambda kv: -kv[1])[:15])
    return dict(span_us=span, busy_us=busy / calls, idle_us=span - busy / calls, largest_gaps_us=top)


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
    block = "llama_block_fwbw" if os.environ.get("BLOCK_STEP") == "train" else "llama_block"
    workload = os.environ.get("PROFILE_WORKLOAD", block)
    work = WORKLOADS[workload]
    train = work.backward
    seq = 8 if run.tiny else int(os.environ.get("PROFILE_SIZE", 2048))
    dtype = torch.float32 if run.tiny else getattr(torch, os.environ.get("PROFILE_DTYPE", "bfloat16"))
    inputs = work.make(seq, dtype, run.device)
    torch._dynamo.reset()
    result, rows = {}, []
    for impl in ("minicomp", "inductor"):
        backend = minicomp.dispatch.dynamo.backend if impl == "minicomp" else "inductor"
        fn = torch.compile(work.fn, backend=backend)
        with torch.set_grad_enabled(train):
            times, gaps = kernel_times(training_step(fn) if train else fn, inputs, 1 if run.tiny else 10, run.device)
        result[impl] = dict(total_us=sum(times.values()), kernels=times, idle=gaps)
        rows += [dict(impl=impl, kernel=name, us=us) for name, us in times.items()]
    jit = minicomp.jit(work.fn)
    if train:
        training_step(jit)(*inputs)
        entry = jit.entry(*inputs)
        result["minicomp_plan"] = str(entry.forward.plan).splitlines() + str(entry.backward.plan).splitlines()
    else:
        result["minicomp_plan"] = str(jit.compiled(*inputs).plan).splitlines()
    run.write(workload=workload, seq=seq, dtype=str(dtype), rows=rows, **result)
    for impl in ("minicomp", "inductor"):
        print(f"{impl}: {result[impl]['total_us']:.1f} us per call", result[impl]["idle"])
        for name, us in list(result[impl]["kernels"].items())[:14]:
            print(f"  {us:9.1f}  {name}")


if __name__ == "__main__":
    main()
