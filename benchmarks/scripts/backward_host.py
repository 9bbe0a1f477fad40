"""The host's time in a suite model's forward call and backward call, and cProfile of the backward.

    PYTHONPATH=. python benchmarks/scripts/backward_host.py MODEL

MODEL: a key of minicomp/bench/model_specs.MODELS. After 5 warm steps, 10 steps with the GPU idle
before each: prints the ms a forward call and a backward call return in (the host's time: the
kernels are queued), then cProfile's top functions by own time over the backward calls
(issue #39: host time without graphs). The GPU only.
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

os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()

from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.dispatch.dynamo import registered  # noqa: E402


def main(name: str, steps: int = 10) -> None:
    spec = ms.MODELS[name]
    sizes, bf16 = spec.sizes(False), torch.bfloat16
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, "train", "cuda", bf16)
    args, kwargs, target = ms.step_inputs(spec, sizes, "train", task, sizes.length, "cuda", bf16, bf16)
    compiled = torch.compile(task, backend=registered())
    for _ in range(5):
        compiled(*args, target=target, **kwargs).backward()
        task.zero_grad(set_to_none=True)
    profile, forward_s, backward_s = cProfile.Profile(), 0.0, 0.0
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = compiled(*args, target=target, **kwargs)
        middle = time.perf_counter()
        profile.enable()
        loss.backward()
        profile.disable()
        forward_s, backward_s = forward_s + middle - start, backward_s + time.perf_counter() - middle
        task.zero_grad(set_to_none=True)
    forward_ms, backward_ms = round(forward_s / steps * 1e3, 3), round(backward_s / steps * 1e3, 3)
    print(name, "host ms: forward call", forward_ms, "backward call", backward_ms)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
    print(text.getvalue()[-4500:])


if __name__ == "__main__":
    main(sys.argv[1])
