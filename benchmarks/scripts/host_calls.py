"""Where a suite model's step spends its host time (issues #38, #39), in one process.

    PYTHONPATH=. python benchmarks/scripts/host_calls.py MODEL STEP BACKEND [--cprofile]

MODEL: a key of minicomp/bench/model_specs.MODELS; STEP: train, infer, decode, decode-static;
BACKEND: eager, inductor, inductor-ro, minicomp, minicomp-graphs (minicomp/bench/model_row.py).
After 8 warm steps, 5 steps under torch.profiler (CPU and CUDA), each synchronized:
- a step's wall time, the time from its start to its first GPU activity, and the GPU's idle time
  inside it (the step less the union of its GPU activities);
- the CUDA runtime and driver calls a step (count, host µs): a synchronize, a memcpy, a malloc
  or a memset shows here;
- the host time of the ATen ops a step calls outside kernels' launches (top 12 by self time).
With --cprofile: the top 25 Python functions of 20 steps by own time.
"""

import collections
import cProfile
import os
import pstats
import statistics
import sys
import tempfile

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402

from minicomp.bench import model_row  # noqa: E402

STEPS = 5


def main(name: str, step: str, variant: str, use_cprofile: bool) -> None:
    run = model_row.real_step(name, step, variant)
    prof = model_row.profiled(run, STEPS, each_synchronized=True)
    events = prof.events()
    steps = [e for e in events if e.name == "one_step" and e.device_type == DeviceType.CPU]
    gpu = [e for e in events if e.device_type == DeviceType.CUDA]
    walls, firsts, idles = [], [], []
    for s in steps:
        begin, end = s.time_range.start, s.time_range.end
        inside = [(g.time_range.start, g.time_range.end) for g in gpu if begin <= g.time_range.start <= end]
        walls.append(end - begin)
        firsts.append(min(i[0] for i in inside) - begin if inside else float("nan"))
        idles.append((end - begin) - model_row.busy_ms(inside) * 1e3)
    calls, call_us = collections.Counter(), collections.Counter()
    ops, op_us = collections.Counter(), collections.Counter()
    for e in events:
        if e.device_type != DeviceType.CPU or e.name == "one_step":
            continue
        if e.name.startswith(("cuda", "cu")):
            calls[e.name] += 1 / STEPS
            call_us[e.name] += e.cpu_time_total / STEPS
        elif e.name.startswith("aten::"):
            ops[e.name] += 1 / STEPS
            op_us[e.name] += e.self_cpu_time_total / STEPS
    kernels = sum(1 for g in gpu) / STEPS
    print(
        f"== {name} {step} {variant}: step {statistics.median(walls):.1f} us, first GPU activity after"
        f" {statistics.median(firsts):.1f} us, GPU idle {statistics.median(idles):.1f} us,"
        f" {kernels:.0f} GPU activities a step"
    )
    print("  runtime/driver calls a step (count, host us):")
    for call, count in calls.most_common():
        print(f"   {count:6.1f} {call_us[call]:9.1f} us  {call}")
    print("  ATen ops a step by self host time (count, us):")
    for op, us in op_us.most_common(12):
        print(f"   {ops[op]:6.1f} {us:9.1f} us  {op}")
    if use_cprofile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            run()
        torch.cuda.synchronize()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main(*sys.argv[1:4], use_cprofile="--cprofile" in sys.argv)
