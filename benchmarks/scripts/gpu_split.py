"""A suite model's step split into GPU time and the host's, in one process (issues #38, #39).

    PYTHONPATH=. python benchmarks/scripts/gpu_split.py MODEL train|infer inductor|minicomp|eager

MODEL: a key of minicomp/bench/model_specs.MODELS. After 8 warm steps: the median step with a
synchronize after it (and its minimum), the median time a step takes to return with the GPU idle
before it (the host's time when it is longer than the GPU's), the GPU's kernel time a step
(torch.profiler, 5 steps), the kernels a step, and the top 14 kernels. Run it once per backend and
more than once per tree: a step's host time moves by 20% between processes on these machines.
"""

import collections
import importlib
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.dispatch.dynamo import registered  # noqa: E402


def main(name: str, step: str, backend: str) -> None:
    spec, train = ms.MODELS[name], step == "train"
    sizes, bf16 = spec.sizes(False), torch.bfloat16
    task = ms.build_task(spec, importlib.import_module(spec.library), sizes, step, "cuda", bf16)
    args, kwargs, target = ms.step_inputs(spec, sizes, step, task, sizes.length, "cuda", bf16, bf16)
    compiled = task
    if backend != "eager":
        compiled = torch.compile(task, backend=registered() if backend == "minicomp" else "inductor")

    def one_step():
        if train:
            compiled(*args, target=target, **kwargs).backward()
            task.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                compiled(*args, **kwargs)

    for _ in range(8):
        one_step()
    torch.cuda.synchronize()
    steps, returns = [], []
    for _ in range(50):
        start = time.perf_counter()
        one_step()
        torch.cuda.synchronize()
        steps.append(time.perf_counter() - start)
    for _ in range(20):
        torch.cuda.synchronize()
        start = time.perf_counter()
        one_step()
        returns.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            one_step()
        torch.cuda.synchronize()
    gpu_us, count = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            gpu_us[event.name] += event.device_time_total / 5
            count[event.name] += 1 / 5
    print(
        f"== {name} {step} {backend}: step {statistics.median(steps) * 1e3:.3f} ms (min {min(steps) * 1e3:.3f});"
        f" host-return {statistics.median(returns) * 1e3:.3f} ms; gpu {sum(gpu_us.values()) / 1e3:.3f} ms;"
        f" kernels {sum(count.values()):.0f}"
    )
    for kernel, us in gpu_us.most_common(14):
        print(f"   {us:8.1f} us x{count[kernel]:4.1f} {kernel[:110]}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
