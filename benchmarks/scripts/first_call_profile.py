"""A suite model's first training step through minicomp, cold caches: stages and cProfile's top.

    PYTHONPATH=. python benchmarks/scripts/first_call_profile.py MODEL

MODEL: a key of minicomp/bench/model_specs.MODELS (PROFILE=0 in the environment: no cProfile,
stages only, at the speed a user sees). Prints the first step's wall and CPU seconds
and the step after it, minicomp's stages summed over its graphs (compile_cost.Recorder: ir,
plan, codegen, load, Triton compiles, tuning), then cProfile's functions by cumulative and by own
time (a function that dominates one stage shows there: issue #42). The GPU only.
"""

import cProfile
import importlib
import io
import json
import os
import pstats
import sys
import tempfile
import time

import torch

os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()

from benchmarks.experiments.compile_cost import Recorder  # noqa: E402
from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.dispatch.dynamo import registered  # noqa: E402


def main(name: str) -> None:
    spec = ms.MODELS[name]
    sizes, bf16 = spec.sizes(False), torch.bfloat16
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, "train", "cuda", bf16)
    args, kwargs, target = ms.step_inputs(spec, sizes, "train", task, sizes.length, "cuda", bf16, bf16)
    recorder, compiled = Recorder(), torch.compile(task, backend=registered())
    profile = cProfile.Profile() if os.environ.get("PROFILE") != "0" else None

    def step():
        compiled(*args, target=target, **kwargs).backward()
        torch.cuda.synchronize()

    start, cpu = time.perf_counter(), time.process_time()
    if profile:
        profile.enable()
    step()
    if profile:
        profile.disable()
    first, cpu = time.perf_counter() - start, time.process_time() - cpu
    start = time.perf_counter()
    step()
    print(name, "first", round(first, 2), "cpu", round(cpu, 2), "again", round(time.perf_counter() - start, 4))
    print(json.dumps(recorder.stages()))
    for order, count in () if profile is None else (("cumulative", 45), ("tottime", 25)):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(count)
        print(text.getvalue()[-9000:])


if __name__ == "__main__":
    main(sys.argv[1])
