"""Run in a fresh process by the harness: time the first call of one compiled function.

    python minicomp/bench/compile_probe.py {minicomp|inductor} {cuda|cpu} [new-rows|new-seq|block]

Prints one number on its last line: seconds for the first call (trace + compile + run), with
whatever caches the environment points at (empty for "cold", filled for "warm").
The clock starts after `import torch` and the inputs, before `import minicomp`
(or Inductor's first `torch.compile` call, which imports torch._dynamo): both
pay their imports inside it, as a user's script does. The workload functions
are read from workloads.py by path, so nothing of minicomp loads before the clock.
For minicomp the line before is its compile's breakdown (Compiled.breakdown) as JSON: empty
when the call was served from the cache.
With `new-rows`: seconds for the first call of bias + ReLU at a new row count
(2048 x 1024), after one call at 1024 x 1024 in the same process (a new batch size).
With `new-seq`: seconds for the first call of RoPE (q, k of [2, 8, S, 64]) at a
third sequence length, after calls at two others (minicomp's kernel family, or
Inductor's automatic dynamic shapes, has seen the size change).
With `block`: seconds for the first training step (forward + backward) of the bench's
Llama-style decoder block (`llama_block_fwbw`: bf16, B=4, S=2048, d=2048, GQA) through
`torch.compile`, Inductor or `backend=minicomp.dispatch.dynamo.backend` (S=8, float32 on the CPU).
With MINICOMP_PROBE_PROFILE=FILE in the environment the timed region runs under cProfile and
its stats are written to FILE (benchmarks/experiments/cold_start.py reads them). With
MINICOMP_PROBE_COMPILES=1, the block's line says how many of this process's Triton compiles
found their binary in Triton's cache (a compile worker's) and how many compiled.
"""

import contextlib
import cProfile
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch


def _workloads():
    """minicomp/tools/workloads.py as a module of its own (it imports only torch): importing it as
    minicomp.tools.workloads would import minicomp before the clock starts."""
    path = Path(__file__).parents[1] / "tools" / "workloads.py"
    spec = importlib.util.spec_from_file_location("probe_workloads", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def compiled(fn, impl: str, dynamo: bool = False):
    if impl == "minicomp":
        import minicomp

        if dynamo:  # by function: the "minicomp" name needs the package installed (an entry point)
            import minicomp.dispatch.dynamo

            return torch.compile(fn, backend=minicomp.dispatch.dynamo.backend)
        return minicomp.jit(fn)
    return torch.compile(fn)


def block_step(workloads, device: str):
    """The decoder block's training step and its inputs (the bench's llama_block_fwbw)."""
    seq, dtype = (2048, torch.bfloat16) if device == "cuda" else (8, torch.float32)
    inputs = workloads.WORKLOADS["llama_block_fwbw"].make(seq, dtype, torch.device(device))

    def step(fn):
        out = fn(*inputs)
        out.backward(torch.ones_like(out))

    return step, inputs


def main() -> None:
    impl, device, mode = sys.argv[1], sys.argv[2], sys.argv[3:]
    workloads = _workloads()
    if mode == ["block"]:
        return time_block(workloads, impl, device)
    fn = workloads.rope if mode == ["new-seq"] else workloads.bias_relu

    def inputs(size):
        if mode == ["new-seq"]:
            return [torch.randn(2, 8, size, 64, device=device) for _ in range(2)] + [
                torch.randn(size, 64, device=device) for _ in range(2)
            ]
        return [torch.randn(size, 1024, device=device), torch.randn(1024, device=device)]

    earlier = {"new-rows": [1024], "new-seq": [256, 512]}.get(mode[0] if mode else "", [])
    args = inputs(2048 if mode == ["new-rows"] else 1024)
    if earlier:  # a process that already runs the function: its imports are done
        fn = compiled(fn, impl)
        for size in earlier:
            fn(*inputs(size))
    with _clock(device) as seconds:
        if not earlier:
            fn = compiled(fn, impl)
        fn(*args)
    if impl == "minicomp":  # where a compile in this process went (nothing when served from the cache)
        done = getattr(list(fn.cache.values())[-1], "compiled", None)  # the entry of this call
        print(json.dumps(done.breakdown() if done is not None else {}))
    print(f"{seconds[0]:.6f}")


def time_block(workloads, impl: str, device: str) -> None:
    step, _ = block_step(workloads, device)
    compiles = _triton_compiles() if os.environ.get("MINICOMP_PROBE_COMPILES") else None
    with _clock(device) as seconds:
        step(compiled(workloads.llama_block, impl, dynamo=True))
    said = _launches() if impl == "minicomp" else {}
    if compiles is not None:
        said["this process's Triton compiles (cache hits, misses)"] = [compiles.count(True), compiles.count(False)]
    print(json.dumps(said))
    print(f"{seconds[0]:.6f}")


def _launches() -> dict:
    """What the kernels of this process's compiles spent on their first calls (Launch.times, summed
    over every Launch alive): a Dynamo compile's Compiled objects are AOTAutograd's to keep."""
    import gc

    from minicomp.runtime.launch import Launch

    launches = [o for o in gc.get_objects() if type(o) is Launch]  # (isinstance trips on dead weak proxies)
    return {
        "kernels": len(launches),
        "waited for compiles (s)": sum(la.times.get("compile", 0.0) for la in launches),
        "tuning (s)": sum(la.times.get("tune", 0.0) for la in launches),
        "kernels tuned": sum(1 for la in launches if len(la.ahead.configs) > 1 or la.times.get("tune", 0) > 0.01),
        "triton compiles": sum(la.compiles for la in launches),
    }


def _triton_compiles() -> list[bool]:
    """Whether each `triton.compile` of this process (not of a compile worker) found its binary in
    Triton's cache, from now on (MINICOMP_PROBE_COMPILES: it imports Triton before the clock)."""
    from triton import knobs

    found: list[bool] = []
    knobs.compilation.listener = lambda **kw: found.append(kw["cache_hit"])
    return found


@contextlib.contextmanager
def _clock(device: str):
    """Seconds of the block (a one-element list, filled on exit), under cProfile when asked."""
    seconds = [0.0]
    profile_path = os.environ.get("MINICOMP_PROBE_PROFILE")
    profiler = cProfile.Profile() if profile_path else None
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    yield seconds
    if device == "cuda":
        torch.cuda.synchronize()
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile_path)
    seconds[0] = time.perf_counter() - start


if __name__ == "__main__":
    main()
