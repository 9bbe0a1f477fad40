"""Run in a fresh process by the harness: time the first call of one compiled function.

    python minicomp/bench/compile_probe.py {minicomp|inductor} {cuda|cpu} [new-rows|new-seq]

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
"""

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch


def _workloads():
    """minicomp/workloads.py as a module of its own (it imports only torch): importing it as
    minicomp.workloads would import minicomp before the clock starts."""
    spec = importlib.util.spec_from_file_location("probe_workloads", Path(__file__).parents[1] / "workloads.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def compiled(fn, impl: str):
    if impl == "minicomp":
        import minicomp

        return minicomp.jit(fn)
    return torch.compile(fn)


def main() -> None:
    impl, device, mode = sys.argv[1], sys.argv[2], sys.argv[3:]
    workloads = _workloads()
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
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    if not earlier:
        fn = compiled(fn, impl)
    fn(*args)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if impl == "minicomp":  # where a compile in this process went (nothing when served from the cache)
        done = getattr(list(fn.cache.values())[-1], "compiled", None)  # the entry of this call
        print(json.dumps(done.breakdown() if done is not None else {}))
    print(f"{seconds:.6f}")


if __name__ == "__main__":
    main()
