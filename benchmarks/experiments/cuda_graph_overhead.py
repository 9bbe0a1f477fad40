"""The host's time of a call with and without CUDA graphs (runtime/graphs.py), against Inductor's.

    python -m benchmarks.experiments.cuda_graph_overhead OUT.json

Three calls, each small enough that the host decides the time (issue #39):
- `tiny`: (x + y).relu() on 1024 float32 elements, inference;
- `mlp_infer`: Linear(512, 2048) - GELU - Linear(2048, 512) at batch 1, no_grad (one decoding
  step's shape);
- `mlp_train`: the same MLP at batch 32, a forward and backward step (gradients reset to None).

For each of eager, minicomp (jit; the training step through `minicomp.jit` runs without graphs),
minicomp-graphs (`minicomp.jit(..., cuda_graphs=True)`), minicomp-dynamo (`torch.compile(backend=
"minicomp")`), minicomp-dynamo-graphs (`mode="reduce-overhead"`), inductor and inductor-ro
(`mode="reduce-overhead"`): `host_us`, the host's time a call with the GPU held busy by a sleep
queued first (step_host_time.py's method, 50 calls, the least of 3 rounds (env OVERHEAD_ROUNDS),
the implementations in turn, after 200 calls of each: a process's first timed calls read up to 1.7x
its later ones), `gpu_us` (CUDA events around the same calls), `wall_us` (a call timed alone, synchronized:
what a caller waiting on each result sees) and, for the training step, `peak_mib` (the allocator's
peak over the measured steps, after warm-up, graphs recorded), `hot_path` (a `minicomp.jit` call
served without its key: dispatch/hot_path.py). `graphs_recorded` counts the graphs
an implementation recorded in its first 3 calls, `graph_refusals` what the "cudagraphs" log channel
said ran without one. --tiny runs eager and minicomp's graphed forms of `tiny` and the training step
through the backend (they refuse: CPU tensors). Env OVERHEAD_CASES and OVERHEAD_IMPLS (comma
lists) choose some of the cases and implementations.
"""

from __future__ import annotations

import copy
import logging
import os
import time

import torch

import minicomp
from benchmarks.experiments import harness
from benchmarks.experiments.step_host_time import host_and_gpu_us
from minicomp.dispatch.dynamo import backend as minicomp_backend

ROUNDS = int(os.environ.get("OVERHEAD_ROUNDS", "3"))
WARM_CALLS = 200


def _tiny(x, y):
    return (x + y).relu()


def _mlp(device, width):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
    ).to(device)


def _compilers(tiny: bool) -> dict:
    compilers = {
        "eager": lambda f: f,
        "minicomp-graphs": lambda f: minicomp.jit(f, cuda_graphs=True),
        "minicomp-dynamo-graphs": lambda f: torch.compile(f, backend=minicomp_backend, mode="reduce-overhead"),
    }
    if not tiny:
        compilers["minicomp"] = minicomp.jit
        compilers["minicomp-dynamo"] = lambda f: torch.compile(f, backend=minicomp_backend)
        compilers["inductor"] = torch.compile
        compilers["inductor-ro"] = lambda f: torch.compile(f, mode="reduce-overhead")
    chosen = os.environ.get("OVERHEAD_IMPLS")
    return {k: v for k, v in compilers.items() if chosen is None or k in chosen.split(",")}


def _cases(run: harness.Run):
    """name -> make(compile) -> (step, the compiled object)."""
    device, width = run.device, 16 if run.tiny else 512
    x, y = torch.randn(1024, device=device), torch.randn(1024, device=device)
    model = _mlp(device, width)
    token = torch.randn(1, width, device=device)
    batch = torch.randn(32, width, device=device)

    def tiny(compile_):
        fn = compile_(_tiny)
        return (lambda: fn(x, y)), fn

    def mlp_infer(compile_):
        fn = compile_(copy.deepcopy(model))

        def step():
            with torch.no_grad():
                return fn(token)

        return step, fn

    def mlp_train(compile_):
        copied = copy.deepcopy(model)
        fn = compile_(copied)
        params = list(copied.parameters())

        def step():
            for p in params:
                p.grad = None
            fn(batch).square().mean().backward()

        return step, fn

    if run.tiny:  # (the inference MLP adds nothing to a smoke run)
        return {"tiny": tiny, "mlp_train": mlp_train}
    cases = {"tiny": tiny, "mlp_infer": mlp_infer, "mlp_train": mlp_train}
    chosen = os.environ.get("OVERHEAD_CASES")
    return {k: v for k, v in cases.items() if chosen is None or k in chosen.split(",")}


class _Said(logging.Handler):
    """What the "cudagraphs" log channel said meanwhile: graphs recorded, refusals."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _wall_us(step, tiny: bool) -> float:
    calls = 3 if tiny else 200
    best = float("inf")
    for _ in range(1 if tiny else ROUNDS):
        if not tiny:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            step()
            if not tiny:
                torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main(argv=None):
    run = harness.parse(argv, __doc__)
    for name in ("recompile_limit", "cache_size_limit"):  # one code object, compiled for each implementation
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    rows = []
    for case, make in _cases(run).items():
        torch._dynamo.reset()  # (the cases in turn: a case's compiled functions are done with when the next starts)
        steps, said = {}, {}
        channel = logging.getLogger("minicomp.cudagraphs")
        for impl, compile_ in _compilers(run.tiny).items():
            if run.tiny and case == "mlp_train" and impl != "minicomp-dynamo-graphs":
                continue  # (a smoke run: the training step through the backend only)
            handler, level = _Said(), channel.level
            channel.addHandler(handler)
            channel.setLevel(logging.INFO)
            try:
                step, fn = make(compile_)
                for _ in range(3):  # compile, warm up, record
                    step()
            finally:
                channel.removeHandler(handler)
                channel.setLevel(level)
            steps[impl], said[impl] = (step, fn), handler.lines
        if not run.tiny:
            for step, _ in steps.values():
                for _ in range(WARM_CALLS):
                    step()
        best = {}
        for _ in range(1 if run.tiny else ROUNDS):  # the implementations in turn, each round
            for impl, (step, _) in steps.items():
                host, gpu, ahead = host_and_gpu_us(step, run.tiny)
                if impl not in best or host < best[impl][0]:
                    best[impl] = (host, gpu, ahead)
        for impl, (step, _) in steps.items():
            row = dict(case=case, impl=impl, host_us=best[impl][0], gpu_us=best[impl][1], host_ahead=best[impl][2])
            row["wall_us"] = _wall_us(step, run.tiny)
            if case == "mlp_train" and not run.tiny:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
                row["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
            row["hot_path"] = getattr(steps[impl][1], "_hot", None) is not None  # (minicomp.jit's keyless calls)
            row["graphs_recorded"] = sum("graph recorded" in line for line in said[impl])
            row["graph_refusals"] = [line for line in said[impl] if "without" in line]
            rows.append(row)
            print(
                f"{case:10s} {impl:24s} host {row['host_us']:8.1f} us  gpu {row['gpu_us']:8.1f} us  "
                f"wall {row['wall_us']:8.1f} us  graphs {row['graphs_recorded']} {row['graph_refusals'] or ''}"
            )
    run.write(rows=rows)


if __name__ == "__main__":
    main()
