"""Host time of a step: the code compiled for a length against the dynamic graph's code at it (issue #42).

    PYTHONPATH=. python benchmarks/scripts/dynamic_host_profile.py MODEL STEP LENGTH

As dynamic_vs_static.py builds both variants. For each: the host's ms a step over 200 steps with
no synchronize (bounded by the GPU once its queue fills), then cProfile of 200 steps, each step
profiled alone and followed by a synchronize (so no launch waits on a full queue and each
function's time is its own), by own time and by cumulative time. The GPU only.
"""

import cProfile
import importlib
import io
import os
import pstats
import sys
import tempfile
import time

os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402

sys.path.insert(0, os.getcwd())
from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.bench.model_row import make_step  # noqa: E402
from minicomp.dispatch.dynamo import registered  # noqa: E402

STEPS = 200


def main(name: str, step: str, length: int) -> None:
    spec = ms.MODELS[name]
    sizes, bf16 = spec.sizes(False), torch.bfloat16
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, step, "cuda", bf16)
    for variant in ("static", "dynamic"):
        torch._dynamo.reset()
        compiled = torch.compile(task, backend=registered(), dynamic=False if variant == "static" else None)
        for size in [length] if variant == "static" else [length + 8, length + 7, length]:
            args, kwargs, target = ms.step_inputs(spec, sizes, step, task, size, "cuda", bf16, bf16)
            run = make_step(task, compiled, step, args, kwargs, target)
            run()
            run()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(STEPS):
            run()
        host = (time.perf_counter() - start) / STEPS * 1e3
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        for _ in range(STEPS):
            profiler.enable()
            run()
            profiler.disable()
            torch.cuda.synchronize()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(45)
        print(f"===== {name} {step} {variant} host ms/step (no sync, {STEPS} steps) {host:.3f}")
        print(text.getvalue())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
