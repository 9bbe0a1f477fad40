"""The host's time per forward and backward call, Inductor against minicomp, in one process.

    PYTHONPATH=. python benchmarks/scripts/host_ab.py MODEL train|infer [inductor,minicomp]

MODEL: a key of minicomp/bench/model_specs.MODELS. For each backend, after 6 warm steps: the
median ms a forward call and a backward call return in with the GPU held busy by a long sleep
(so launches never wait: the host's own time; the sleep slows the driver's launches somewhat,
so compare the two backends, not absolute figures), the median step with a synchronize after
it, then torch.profiler's CPU events per step (count, self us) and cProfile's top functions
over 10 steps (issue #39: a step's host time without graphs). The GPU only.
"""

import collections
import cProfile
import importlib
import io
import os
import pstats
import statistics
import sys
import tempfile
import time

os.environ["MINICOMP_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from minicomp.bench import model_specs as ms  # noqa: E402
from minicomp.dispatch.dynamo import registered  # noqa: E402


def median_ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1e3, 3)


def measure(name: str, step: str, backend: str) -> None:
    torch._dynamo.reset()
    spec, train = ms.MODELS[name], step == "train"
    sizes, bf16 = spec.sizes(False), torch.bfloat16
    library = importlib.import_module(spec.library) if spec.library else None  # (DLRM: none)
    task = ms.build_task(spec, library, sizes, step, "cuda", bf16)
    args, kwargs, target = ms.step_inputs(spec, sizes, step, task, sizes.length, "cuda", bf16, bf16)
    compiled = torch.compile(task, backend=registered() if backend == "minicomp" else "inductor")

    def forward():
        if train:
            return compiled(*args, target=target, **kwargs)
        with torch.no_grad():
            return compiled(*args, **kwargs)

    def one_step():
        out = forward()
        if train:
            out.backward()
            task.zero_grad(set_to_none=True)

    for _ in range(6):
        one_step()
    forward_s, backward_s, step_s = [], [], []
    for _ in range(30):
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)  # tens of ms of GPU work: every launch below queues behind it
        start = time.perf_counter()
        out = forward()
        middle = time.perf_counter()
        if train:
            out.backward()
            task.zero_grad(set_to_none=True)
        forward_s.append(middle - start)
        backward_s.append(time.perf_counter() - middle)
        del out
    for _ in range(30):
        torch.cuda.synchronize()
        start = time.perf_counter()
        one_step()
        torch.cuda.synchronize()
        step_s.append(time.perf_counter() - start)
    print(
        f"== {name} {step} {backend}: host ms forward {median_ms(forward_s)} backward {median_ms(backward_s)};"
        f" synchronized step {median_ms(step_s)} ms",
        flush=True,
    )
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            one_step()
        torch.cuda.synchronize()
    counts, self_us = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CPU:
            counts[event.name] += 1
            self_us[event.name] += event.self_cpu_time_total
    print("  CPU events per step (name, count, self us):")
    for event, us in self_us.most_common(22):
        print(f"    {event[:70]:70s} {counts[event] / 3:7.1f} {us / 3:9.1f}")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(10):
        one_step()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue()[-6000:])


if __name__ == "__main__":
    for backend in (sys.argv[3] if len(sys.argv) > 3 else "inductor,minicomp").split(","):
        measure(sys.argv[1], sys.argv[2], backend)
