"""A length's step as the code compiled for it against the dynamic graph's code at that length (issue #42).

    PYTHONPATH=. python benchmarks/scripts/dynamic_vs_static.py MODEL STEP LENGTH TAG [--host]
    SOURCES=1 OUT=dir ...   also writes each variant's generated modules and recompile log there

MODEL: a key of minicomp/bench/model_specs.MODELS; STEP: train or infer. In one process, fresh
minicomp and Triton caches, the suite's model (2 layers, real widths, bf16) through
`torch.compile(backend="minicomp")` twice: `static` (dynamic=False, compiled for LENGTH alone) and
`dynamic` (called at LENGTH + 8, LENGTH + 7, then LENGTH: Dynamo's static graph, its dynamic graph,
then that graph's code at LENGTH). One JSON line per variant: the step's ms (measure.py
`synchronized_ms`, the best of three medians of 30), the profiler's kernels and GPU busy ms a step,
the peak MiB of a step above what was allocated before it, the top kernels. TAG names the tree in
the output (an A/B runs this file from each tree's root).

--host: instead, each variant's host time: 200 steps with no synchronize (bounded by the GPU once
its queue fills), then cProfile of 200 steps, each profiled alone and followed by a synchronize
(no launch waits on a full queue: each function's time is its own), by own and cumulative time.
The GPU only.
"""

import cProfile
import importlib
import io
import json
import logging
import os
import pstats
import sys
import tempfile
import time

os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402

sys.path.insert(0, os.getcwd())  # minicomp from the tree this runs in
from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.bench.measure import synchronized_ms  # noqa: E402
from minicomp.bench.model_row import make_step  # noqa: E402
from minicomp.dispatch.dynamo import registered  # noqa: E402

TEXTS: list[str] = []  # the generated modules and recompile lines of the current variant
HOST_STEPS = 200


class _Keep(logging.Handler):
    def emit(self, record):
        TEXTS.append(record.getMessage())


for channel in ("minicomp.output_code", "minicomp.recompiles"):
    logging.getLogger(channel).addHandler(_Keep())
    logging.getLogger(channel).setLevel(logging.INFO)


def kernels(fn, steps: int = 5) -> tuple[float, float, list]:
    """(kernels a step, GPU busy ms a step, the 6 kernels of most time) from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, float] = {}
    for e in events:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time / steps
    top = sorted(by_name.items(), key=lambda item: -item[1])[:6]
    busy = sum(e.device_time for e in events) / steps / 1e3
    return len(events) / steps, busy, [(name[:70], round(us / 1e3, 4)) for name, us in top]


def peak_mib(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def measured(run, name: str, step: str, length: int, variant: str, tag: str) -> None:
    medians = [synchronized_ms(run, 30) for _ in range(3)]
    count, busy, top = kernels(run)
    row = dict(
        tree=tag, model=name, mode=step, S=length, variant=variant, steady_ms=round(min(medians), 3),
        steady_runs=[round(m, 3) for m in medians], kernels=count, gpu_ms=round(busy, 3),
        peak_mib=round(peak_mib(run), 1), top=top,
    )  # fmt: skip
    print(json.dumps(row), flush=True)
    if os.environ.get("SOURCES") and os.environ.get("OUT"):
        with open(f"{os.environ['OUT']}/{tag}_{name}_{step}_{variant}.txt", "w") as out:
            out.write("\n\n#################\n".join(TEXTS))


def host_profile(run, name: str, step: str, variant: str) -> None:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(HOST_STEPS):
        run()
    host = (time.perf_counter() - start) / HOST_STEPS * 1e3
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    for _ in range(HOST_STEPS):
        profiler.enable()
        run()
        profiler.disable()
        torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(45)
    print(f"===== {name} {step} {variant} host ms/step (no sync, {HOST_STEPS} steps) {host:.3f}")
    print(text.getvalue())


def main(name: str, step: str, length: int, tag: str, host: bool) -> None:
    spec = ms.MODELS[name]
    sizes, bf16 = spec.sizes(False), torch.bfloat16
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, step, "cuda", bf16)
    for variant in ("static", "dynamic"):
        torch._dynamo.reset()
        TEXTS.clear()
        compiled = torch.compile(task, backend=registered(), dynamic=False if variant == "static" else None)
        for size in [length] if variant == "static" else [length + 8, length + 7, length]:
            args, kwargs, target = ms.step_inputs(spec, sizes, step, task, size, "cuda", bf16, bf16)
            run = make_step(task, compiled, step, args, kwargs, target)
            run()
            run()
        if host:
            host_profile(run, name, step, variant)
        else:
            measured(run, name, step, length, variant, tag)


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--host"]
    main(argv[0], argv[1], int(argv[2]), argv[3] if len(argv) > 3 else "", "--host" in sys.argv)
