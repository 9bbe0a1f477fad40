"""A decoding step's host time with CUDA graphs, minicomp against Inductor reduce-overhead.

    PYTHONPATH=. python benchmarks/scripts/decode_host.py MODEL VARIANT

MODEL: gpt2 or llama (minicomp/bench/model_specs.py); VARIANT: minicomp-graphs or inductor-ro.
Prints the host's us a call with the GPU held busy by a sleep (the least of 3 rounds of 200
calls), then cProfile's top functions by own time over 200 calls. The GPU only.
"""

import cProfile
import importlib
import io
import os
import pstats
import sys
import tempfile
import time

import torch

from minicomp.bench import model_specs as ms
from minicomp.dispatch.dynamo import registered


def main(name: str, variant: str) -> None:
    os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())
    spec = ms.MODELS[name]
    sizes = spec.sizes(False)
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, "decode", "cuda", torch.bfloat16)
    args, kwargs, _ = ms.step_inputs(spec, sizes, "decode", task, sizes.length, "cuda", torch.bfloat16, torch.bfloat16)
    backend = {} if variant == "inductor-ro" else {"backend": registered()}
    compiled = torch.compile(task, mode="reduce-overhead", **backend)

    def step():
        with torch.no_grad():
            return compiled(*args, **kwargs)

    for _ in range(10):
        step()
    torch.cuda.synchronize()

    def host_us(n=200):
        torch.cuda._sleep(int(4e9))
        start = time.perf_counter()
        for _ in range(n):
            step()
        us = (time.perf_counter() - start) / n * 1e6
        torch.cuda.synchronize()
        return us

    print(name, variant, "host us/call", round(min(host_us() for _ in range(3)), 1), flush=True)
    profile = cProfile.Profile()
    torch.cuda._sleep(int(4e9))
    profile.enable()
    for _ in range(200):
        step()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(22)
    print(text.getvalue())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
