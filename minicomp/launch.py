"""Launching one generated kernel: pick its configuration once, then launch with nothing in between.

A generated module makes one `Launch` per kernel when it is imported,

    launch_0 = Launch(mc_fused_add_relu_0, numel=4096, device="cuda:0")

and its `call()` runs `launch_0(x, b, relu, 4096)`. The first call on a GPU
chooses (BLOCK_SIZE, num_warps) (`choose` below), compiles through Triton's JIT
(or loads Triton's disk cache) and keeps the compiled kernel. Every later call
hands the arguments straight to that kernel's launcher: no argument binding,
no specialization key, no cache lookup. That is safe because a module serves
exactly one input signature (shapes, strides, dtypes, 16-byte alignment of
every pointer), which the caller's guard (api.py) checked already.

Launch configuration, measured on an H200 (benchmarks/experiments/):
  * kernels under 16M elements: 1024 elements per program and 4 warps (8
    elements, two 16-byte float32 vectors, per thread); tiny ones one program.
  * larger kernels: the best of CANDIDATES, timed on the first call's real
    arguments and remembered on disk (`<cache>/tuning/`), so a second process
    reuses the choice. The spread is real: RoPE in bf16 ran 1.09x the memory
    floor at 1024/4 and 1.03x at 512/4, while bias+ReLU in bf16 went the
    other way (1.08x and 1.34x).
  * Triton's interpreter (CPU) runs one program at a time in numpy: few, large
    programs are fastest there.
"""
from __future__ import annotations

import hashlib
import json
import threading

import torch

from minicomp import logs, runtime

CANDIDATES = [(512, 4), (1024, 4), (2048, 4)]
TUNE_MIN_NUMEL = 1 << 24   # below this a kernel takes a few microseconds: the heuristic is as good


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def heuristic(numel: int, device: torch.device) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) without measuring."""
    if device.type == "cpu":
        return min(max(next_power_of_2(numel), 16), 1 << 16), 1
    if numel <= 4096:
        return max(next_power_of_2(numel), 128), 4 if numel > 1024 else 1
    return 1024, 4


class Launch:
    """One kernel of a generated module, launched as cheaply as Triton allows."""

    def __init__(self, kernel, numel: int, device: str):
        self.kernel, self.numel, self.device = kernel, numel, torch.device(device)
        self.name = kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__
        self.config: tuple[int, int] | None = None
        self._fast = None   # the bound launcher, once the kernel is compiled
        self._lock = threading.Lock()

    def grid(self, block: int) -> int:
        return -(-self.numel // block)

    def __call__(self, *args):
        fast = self._fast
        if fast is not None:
            return fast(*args)
        if self.device.type == "cpu":  # the interpreter: nothing to keep
            block, warps = heuristic(self.numel, self.device)
            self.kernel[(self.grid(block),)](*args, BLOCK_SIZE=block, num_warps=warps)
            return None
        return self._first_call(args)

    def _first_call(self, args):
        with self._lock, torch.cuda.device(self.device):
            if self.config is None:
                self.config = self.choose(args)
            block, warps = self.config
            compiled = self.kernel[(self.grid(block),)](*args, BLOCK_SIZE=block, num_warps=warps)
            if self._fast is None:
                self._fast = _bind(compiled, self.grid(block), block, self.device.index or 0)
        return None

    # -- configuration --------------------------------------------------------
    def choose(self, args) -> tuple[int, int]:
        if self.numel < TUNE_MIN_NUMEL:
            return heuristic(self.numel, self.device)
        path = runtime.cache_dir() / "tuning" / f"{self.name}_{self._tuning_key()}.json"
        try:
            block, warps = json.loads(path.read_text())["config"]
            logs.cache.info("tuned launch config for %s from %s: %s x %s warps", self.name, path, block, warps)
            return block, warps
        except (OSError, ValueError, KeyError, TypeError):
            pass  # absent or unreadable: measure again
        times = {config: self._time(config, args) for config in CANDIDATES}
        best = min(times, key=times.get)
        logs.fusion.info("%s: launch configs %s -> %s", self.name,
                         {f"{b}x{w}": f"{ms:.3f} ms" for (b, w), ms in times.items()}, best)
        runtime.write_atomic(path, json.dumps({"config": list(best), "ms": {f"{b}x{w}": ms for (b, w), ms in
                                                                            times.items()}}))
        return best

    def _time(self, config, args) -> float:
        import triton.testing

        block, warps = config
        grid = (self.grid(block),)
        run = lambda: self.kernel[grid](*args, BLOCK_SIZE=block, num_warps=warps)  # noqa: E731
        run()  # compile outside the timed region
        return triton.testing.do_bench(run, warmup=5, rep=25, return_mode="median")

    def _tuning_key(self) -> str:
        import triton

        text = "\n".join([self.kernel.src, str(self.numel), torch.cuda.get_device_name(self.device),
                          triton.__version__])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _bind(compiled, grid: int, block: int, device_index: int):
    """A function that launches `compiled` on the current stream, arguments as given."""
    launcher, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    current_stream = torch._C._cuda_getCurrentRawStream
    current_device = torch._C._cuda_getDevice

    def fast(*args):
        if current_device() != device_index:  # launches go to the current device's context
            with torch.cuda.device(device_index):
                return fast(*args)
        launcher(grid, 1, 1, current_stream(device_index), function, metadata, None, None, None, *args, block)
        return None

    return fast
