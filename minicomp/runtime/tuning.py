"""Choosing a kernel's launch configuration: which ones to consider, and timing them.

A small kernel takes its spec's heuristic. A large one (`LaunchSpec.tuned`) takes
the choice a tuning record remembers (records.py: measured at a size of its class,
size_classes.py) where that is one of its own candidates, else times each of its
spec's candidates on the first call's arguments and remembers the fastest.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable

import torch

from minicomp import logs

TIMED_RUNS = 15  # runs a tuning candidate is timed over (kernels this large run >= ~20 us each)
QUEUE_CYCLES = 4_000_000  # GPU clock cycles of sleep the timed launches queue behind (~2 ms)

Config = tuple[int, int]  # (BLOCK_SIZE or XBLOCK, num_warps)


def configs(spec, device: torch.device, records) -> list[Config]:
    """The configurations the first call chooses from: the heuristic's (a small kernel), the
    remembered choice, or the candidates to time (each once; one alone needs no timing)."""
    if not spec.tuned():
        return [spec.heuristic(device)]
    candidates = list(dict.fromkeys(spec.candidates()))
    remembered = records.remembered_config(spec.numel)  # (measured at a size of this one's class)
    return [remembered] if remembered in candidates else candidates


def choose(found: list[Config], spec, records, time: Callable[[Config, list], float], args) -> Config:
    """Of `found` (the configurations `configs` gave), the fastest on these arguments by `time`
    (milliseconds of a run), remembered on disk."""
    if len(found) > 1:  # a kernel of the same skeleton may have been tuned since `found` was made
        remembered = records.remembered_config(spec.numel)
        found = [remembered] if remembered in found else found
    if len(found) == 1:
        return found[0]
    private = unaliased(args)
    times = {candidate: time(candidate, private) for candidate in found}
    best = min(times, key=times.get)
    logs.fusion.info(
        "%s: launch configs %s -> %s",
        records.name,
        {f"{b}x{w}": f"{ms:.3f} ms" for (b, w), ms in times.items()},
        best,
    )
    records.remember_config(spec.numel, best, times)
    return best


def time_config(kernel, grid: int, settings: dict, args) -> float:
    """Milliseconds of one run of `kernel` at `settings`: the median of TIMED_RUNS runs, each
    between two CUDA events, queued behind a GPU sleep so that the launches wait on the GPU, not
    the GPU on them (the events then time the kernel, not Python's launch path)."""
    run = lambda: kernel[(grid,)](*args, **settings)  # noqa: E731
    run()  # compiled ahead (ahead.py), else compiles here, outside the timed runs
    return median_ms(run, TIMED_RUNS)


def median_ms(run, runs: int) -> float:
    """Milliseconds of `run()` on the GPU: the median of `runs` runs, each between two CUDA events,
    queued behind a GPU sleep (about 2 ms)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    torch.cuda._sleep(QUEUE_CYCLES)
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def unaliased(args) -> list:
    """The arguments with each tensor that shares memory with another replaced by a copy: tuning
    runs the kernel many times, and one that writes an output over a buffer it reads (in place,
    codegen/reuse.py) would read its own results from the second run on."""
    storages = collections.Counter(a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor))

    def private(a):
        if not isinstance(a, torch.Tensor) or storages[a.untyped_storage().data_ptr()] == 1:
            return a
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)

    return [private(a) for a in args]
