"""Timing and the memory floor: what a run measures, and how.

floor bytes: each input read once, each output written once (for forward +
backward also each gradient read once and each input gradient written once).
floor time = floor bytes / copy bandwidth, measured on the same GPU in the
same run by a large device-to-device copy (bytes read + bytes written).

The floor is what no kernel beats, not what one reaches: a copy of a kernel's
bytes at the kernel's size (`copy_ms`, half read and half written) takes
longer than the floor where the size is small enough for the launch and the
last partial wave to show (docs/experiments.md has measured figures). Each
row of the bench is also given as a multiple of that copy (`x copy`).
"""

from __future__ import annotations

import itertools
import time

import torch


def tensor_bytes(values) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def flat_tensors(value) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def floor_bytes(inputs, outputs, backward: bool) -> int:
    moved = tensor_bytes(inputs) + tensor_bytes(outputs)
    if backward:  # read a gradient per output, write one per input that requires grad
        moved += tensor_bytes(outputs) + tensor_bytes([i for i in inputs if i.requires_grad])
    return moved


def copy_bandwidth(device, nbytes: int = 2 << 30) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus written."""
    import triton.testing

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * nbytes / (ms * 1e-3)


def copy_ms(nbytes: int, device) -> float:
    """Median ms of a device-to-device copy moving `nbytes` in all: nbytes / 2 read, as many written
    (do_bench flushes the L2 before each run, as for the workloads)."""
    import triton.testing

    src = torch.empty(max(nbytes // 2, 1), dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    return triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")


def input_sets(make, size, dtype, device, l2_bytes: int) -> list[list]:
    """Enough input sets that rotating through them never hits a warm L2."""
    first = make(size, dtype, device)
    count = min(8, max(1, -(-2 * l2_bytes // max(tensor_bytes(first), 1))))
    return [first] + [make(size, dtype, device) for _ in range(count - 1)]


def time_ms(fn, sets, backward: bool) -> float:
    """Median ms of fn over rotating input sets (triton.testing.do_bench)."""
    import triton.testing

    cycle = itertools.cycle(sets)
    if not backward:
        return triton.testing.do_bench(lambda: fn(*next(cycle)), warmup=25, rep=200, return_mode="median")
    grads = [[torch.randn_like(o) for o in flat_tensors(fn(*s))] for s in sets]
    pairs = itertools.cycle(zip(sets, grads))

    def step():
        inputs, seeds = next(pairs)
        outs = flat_tensors(fn(*inputs))
        torch.autograd.backward(outs, seeds)

    # reset .grad before each step: accumulating into it would add a read and a write of every gradient
    leaves = [t for s in sets for t in s if isinstance(t, torch.Tensor) and t.requires_grad]
    return triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median", grad_to_none=leaves)


def synchronized_ms(fn, calls: int = 20) -> float:
    """Median ms of `fn` called `calls` times, each between two CUDA events and followed by a
    synchronize: a step's latency as a loop that waits for each result sees it (host time the GPU
    waits on counts, unlike in `time_ms`)."""
    times = []
    for _ in range(calls):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    times.sort()
    return (times[(calls - 1) // 2] + times[calls // 2]) / 2


def peak_bytes(fn, inputs, backward: bool) -> int:
    """Memory one call (forward + backward for a training workload) allocates at its peak beyond
    what is allocated before it (the inputs): saved activations, outputs, gradients and temporaries.
    Measured by torch.cuda.max_memory_allocated; the call is made once before, so that a first
    call's compiles and tuning buffers are not counted."""
    inputs = [i.detach().clone().requires_grad_(i.requires_grad) for i in inputs]

    def step():
        outs = flat_tensors(fn(*inputs))
        if backward:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        del outs
        for i in inputs:
            i.grad = None

    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def per_call_us(fn, args, calls: int = 2000) -> float:
    """Host time per call in the launch-bound regime: many calls, one sync at the end."""
    for _ in range(50):
        fn(*args)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6
