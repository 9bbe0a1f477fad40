"""Where a suite model's cold first step goes: Dynamo's timed phases, the backend call, minicomp's
stages, and (--timeline) when each compile, worker start and first-call wait happened.

    PYTHONPATH=. python benchmarks/scripts/first_call_split.py MODEL STEP VARIANT [--timeline]

MODEL: a key of minicomp/bench/model_specs.MODELS; STEP: train or infer; VARIANT: minicomp or
inductor. Every cache (minicomp's, Inductor's, Triton's) is a fresh temporary directory, so each
run is a cold first call (issues #38, #42). Prints one `SPLIT {json}` line: import_build (the
process's start to the model built), first and second step (s), backend (Dynamo's
call_user_compiler: AOTAutograd and the compiler), `dynamo` (torch's dynamo_timed phases, summed)
and, for minicomp, `stages` (compile_cost.Recorder); `gc_full`: the full collections of Python's
garbage collector during the first step and their seconds (each walks every object of the process).
--timeline (minicomp): seconds from the first step's start of the backend call, the pipeline, each
worker's start, each compile ahead (ahead.py) and its part in a worker, and each wait of a first
call for its kernel's compiles. The GPU only.
"""

import gc
import importlib
import json
import os
import sys
import tempfile
import threading
import time

START = time.perf_counter()
for variable in ("MINICOMP_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
    os.environ[variable] = tempfile.mkdtemp()

import torch  # noqa: E402
from torch._dynamo import output_graph  # noqa: E402
from torch._dynamo.utils import compilation_time_metrics  # noqa: E402

from minicomp.bench import model_row, model_specs  # noqa: E402

EVENTS: list[tuple] = []  # (what, start, end, thread, kernel)
T0: list[float] = []
FULL_GC = [0, 0.0, 0.0]  # full collections since the first step began, their seconds, the current one's start


def _full_collections(phase: str, info: dict) -> None:
    if not T0 or info["generation"] != 2:
        return
    if phase == "start":
        FULL_GC[2] = time.perf_counter()
    else:
        FULL_GC[0] += 1
        FULL_GC[1] += time.perf_counter() - FULL_GC[2]


def _timed(owner, name: str, what: str) -> None:
    """`owner.name` wrapped: each call's start and end (seconds from the first step's start)."""
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        now = lambda: time.perf_counter() - T0[0] if T0 else -1.0  # noqa: E731
        start = now()
        try:
            return original(*args, **kwargs)
        finally:
            launch = args[1] if what == "compile" else None
            EVENTS.append((what, start, now(), threading.current_thread().name, getattr(launch, "name", "")))

    setattr(owner, name, timed)


def main(model: str, step: str, variant: str, timeline: bool) -> None:
    spec = model_specs.MODELS[model]
    library = importlib.import_module(spec.library) if spec.library else None
    importlib.import_module("minicomp" if variant == "minicomp" else "torch._inductor.compile_fx")
    recorder = None
    if variant == "minicomp":
        from benchmarks.experiments.compile_cost import Recorder
        from minicomp.dispatch import dynamo
        from minicomp.runtime import ahead, compile_processes

        recorder = Recorder()
        if timeline:
            _timed(ahead.Ahead, "_compile", "compile")
            _timed(ahead.Ahead, "wait", "wait")
            _timed(compile_processes, "compile_in_worker", "in worker")
            _timed(compile_processes.Worker, "__init__", "worker start")
            _timed(dynamo, "compile_graph", "pipeline")
    _timed(output_graph.OutputGraph, "call_user_compiler", "backend")
    sizes = spec.sizes(False)
    task = model_specs.build_task(spec, library, sizes, step, "cuda", torch.bfloat16)
    args, kwargs, target = model_specs.step_inputs(
        spec, sizes, step, task, sizes.length, "cuda", torch.bfloat16, torch.bfloat16
    )
    torch.cuda.synchronize()
    import_build = time.perf_counter() - START
    run = model_row.make_step(task, model_row.compiled(task, variant), step, args, kwargs, target)
    gc.callbacks.append(_full_collections)
    T0.append(time.perf_counter())
    first, _ = model_row.timed_s(run, "cuda")
    gc_full = [FULL_GC[0], round(FULL_GC[1], 3)]
    second, _ = model_row.timed_s(run, "cuda")
    backend = sum(end - start for what, start, end, *_ in EVENTS if what == "backend")
    split = dict(model=model, step=step, variant=variant, import_build=round(import_build, 2), first=round(first, 3))
    split |= dict(second=round(second, 4), backend=round(backend, 3), gc_full=gc_full)
    split["dynamo"] = {name: round(sum(values), 3) for name, values in compilation_time_metrics.items()}
    if recorder is not None:
        split["stages"] = recorder.stages()
    print("SPLIT", json.dumps(split))
    if timeline:
        _print_timeline()


def _print_timeline() -> None:
    by_what: dict[str, list] = {}
    for what, start, end, thread, _ in sorted(EVENTS, key=lambda e: e[1]):
        by_what.setdefault(what, []).append((start, end))
        if what in ("backend", "pipeline", "worker start"):
            print(f"  {what:12s} {start:7.3f} {end:7.3f} {thread}")
    for what, spans in by_what.items():
        took = [end - start for start, end in spans]
        first, last = min(s for s, _ in spans), max(e for _, e in spans)
        print(f"  {what:12s} n={len(spans):3d} from {first:.3f} to {last:.3f} sum {sum(took):.3f} max {max(took):.3f}")
    waits = sorted((start, end - start) for what, start, end, *_ in EVENTS if what == "wait" and end - start > 0.01)
    print("  waits over 10 ms (at, s):", [(round(a, 2), round(d, 3)) for a, d in waits])
    compiles = sorted((e for e in EVENTS if e[0] == "compile"), key=lambda e: e[1] - e[2])
    print("  slowest compiles (at, s, kernel):", [(round(e[1], 2), round(e[2] - e[1], 3), e[4]) for e in compiles[:8]])


if __name__ == "__main__":
    positional = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(*positional[:3], timeline="--timeline" in sys.argv)
