"""The threads kernels compile in ahead of their first call (ahead.py).

One pool a process, made on its first use (a cache hit never needs it), of
MINICOMP_COMPILE_THREADS threads (default: the CPU count, at most 32). Triton
spends a compile in C++ passes that release the GIL and in ptxas and cc
subprocesses, so the threads compile side by side; its Python frontend holds
the GIL, which slows the main thread meanwhile (benchmarks/experiments/compile_threads.py).
"""

from __future__ import annotations

import concurrent.futures
import threading

import torch

from minicomp import config

_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_TRITON_STARTED: dict[int, concurrent.futures.Future] = {}  # device index -> `start_triton`'s task
_POOL_LOCK = threading.RLock()


def pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads kernels compile ahead in (made on the first use: a cache hit never needs them)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(
                max_workers=config.compile_threads(), thread_name_prefix="minicomp-compile"
            )
        return _POOL


def start_triton(values) -> None:
    """Start Triton's one-time costs of a process in a pool thread, so that they overlap the
    capture of the first compile (function.py and dynamo.py call this on a miss, with its
    arguments): its CUDA driver (a C helper, built with cc when Triton's cache is cold) and the
    hash of its own installation that its JIT keys binaries by, for the device of the
    first CUDA tensor among `values` (none: nothing to start). ahead.py waits for it."""
    device = next((v.device for v in values if isinstance(v, torch.Tensor) and v.device.type == "cuda"), None)
    if device is None:
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _POOL_LOCK:
        if index not in _TRITON_STARTED:
            _TRITON_STARTED[index] = pool().submit(_start_triton, index)


def _start_triton(index: int) -> None:
    from triton.runtime.cache import triton_key
    from triton.runtime.driver import driver

    with torch.cuda.device(index):
        driver.active.get_current_target()
    triton_key()


def triton_started(index: int) -> None:
    """Wait for `start_triton`'s task on this device, if one runs (its failure is Triton's to report later)."""
    task = _TRITON_STARTED.get(index)
    if task is not None:
        concurrent.futures.wait([task])
