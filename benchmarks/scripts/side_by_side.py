"""Suite steps of several variants in one process, timed in alternating rounds (issue #39).

    PYTHONPATH=. python benchmarks/scripts/side_by_side.py [--layers N] [--host] MODEL STEP VARIANT [VARIANT ...]

MODEL, STEP, VARIANT as in minicomp/bench/model_row.py (`real_step`); `--layers N` builds the
models with N transformer layers (model_specs.LAYERS, 2 by default). The suite runs a process per
row, and a host-bound step (GPT-2 decoding: ~0.1 ms of GPU work) moved by 10-30% between processes
of one machine; here every variant is built in one process, warmed (30 steps), then timed in 7
rounds of 300 steps each, synchronized after each step as a decoding loop is, the variants taking
turns within a round. Prints each round's µs a step and each variant's median over the rounds, and
its ratio to the first variant's.

`--host` (issue #39: a step's host time without graphs) times instead, in each round, 40 steps of
each variant with the GPU held busy by a long sleep before each (so no launch waits: the µs until
the step returns is the host's own), and after the rounds profiles 10 synchronized steps of each:
the GPU's busy µs a step (the union of its kernels and copies) and the wall µs less that, the time
the GPU waits on the host.
"""

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from minicomp.bench import model_row, model_specs  # noqa: E402

ROUNDS, STEPS = 7, 300


def per_step_us(run) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        run()
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / STEPS * 1e6


def host_us(run) -> float:
    """The median µs a step takes to return with every launch queued behind a long sleep (a step
    that returned after the sleep had ended waited on the GPU: said, not hidden)."""
    times, behind = [], 0
    for _ in range(40):
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)
        slept = torch.cuda.Event()
        slept.record()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
        behind += slept.query()
    if behind:
        print(f"  ({behind} of 40 steps returned after the GPU's sleep had ended: not the host's own time)")
    return statistics.median(times) * 1e6


def gpu_wait_line(run) -> str:
    """The GPU's busy µs a step over 10 profiled synchronized steps (the union of its activities),
    and the wall µs less that."""
    prof, cuda = model_row.profiled(run, 10, each_synchronized=True), torch.autograd.DeviceType.CUDA
    # the GPU's work: its kernels and copies, as a union; not the ranges named on the host that the
    # GPU's timeline also shows ("one_step", Inductor's "## Call CompiledFxGraph": idle gaps inside)
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == cuda and not getattr(e, "is_user_annotation", False) and e.name != "one_step"
    )
    busy, reach = 0.0, float("-inf")
    for start, end in spans:
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    steps = [e for e in prof.events() if e.name == "one_step" and e.device_type != cuda]
    wall = sum(e.cpu_time_total for e in steps) / len(steps)
    return f"GPU busy {busy / 10:.1f} us a step, profiled wall {wall:.1f}: the GPU waits {wall - busy / 10:.1f}"


def main(name: str, step: str, *variants: str, host: bool = False) -> None:
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8 * len(variants))
    runs = {v: model_row.real_step(name, step, v) for v in variants}
    for run in runs.values():
        for _ in range(30):
            run()
    times = {v: [] for v in variants}
    for r in range(ROUNDS):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            times[v].append(host_us(runs[v]) if host else per_step_us(runs[v]))
        print(f"round {r}: " + "  ".join(f"{v} {times[v][-1]:.1f}" for v in variants), flush=True)
    first = statistics.median(times[variants[0]])
    for v in variants:
        median = statistics.median(times[v])
        what = "host" if host else "median"
        print(f"{name} {step} {v}: {what} {median:.1f} us a step, {median / first:.3f}x {variants[0]}")
        if host:
            print(f"{name} {step} {v}: {gpu_wait_line(runs[v])}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--layers"]:
        model_specs.LAYERS, args = int(args[1]), args[2:]
    host = args[:1] == ["--host"]
    main(*args[host:], host=host)
