"""How much of a training step is the host's: enqueue time against GPU time, per compiler.

    python -m benchmarks.experiments.step_host_time OUT.json

`minicomp bench` times a forward + backward step as do_bench does: events around each step, so
where the host takes longer to queue a step's kernels than the GPU takes to run them, the time is
the host's. For each workload and dtype (env STEP_WORKLOADS, STEP_DTYPES; STEP_SIZE, default
2048) and each of eager, Inductor, minicomp and minicomp-aot (config lean_training off:
every call through AOTAutograd's runtime, as before training_call.py), and minicomp-dynamo
(`torch.compile` with minicomp's backend; env STEP_IMPLS picks some of these) this measures, over 50
steps (inputs rotating as in the bench, gradients reset to None):
- `host_us`: the host's time a step, with the GPU held busy by a sleep kernel queued first, so
  the host never waits for it (the queue holds the steps); the least of 3 rounds, the
  implementations measured in turn each round; `host_ahead` false where the sleep ended before
  the host had queued every step (the queue filled: host_us is then not the host's own time);
- `gpu_us`: the GPU's time a step, by CUDA events around the same 50 steps queued behind a
  sleep (the host ahead of it);
- `bench_us`: the bench's own timing (measure.time_ms);
- the host's top functions by own time (cProfile) for minicomp.
"""

from __future__ import annotations

import cProfile
import itertools
import os
import pstats
import sys
import time

import torch

import minicomp
from benchmarks.experiments import harness
from minicomp import config
from minicomp.bench import measure
from minicomp.dispatch.dynamo import backend as minicomp_backend
from minicomp.tools.workloads import WORKLOADS

STEPS = 50
ROUNDS = 3  # each implementation measured this many times, in turn; the least time kept


def stepper(fn, sets):
    grads = [[torch.randn_like(o) for o in measure.flat_tensors(fn(*s))] for s in sets]
    pairs = itertools.cycle(zip(sets, grads))
    leaves = [t for s in sets for t in s if isinstance(t, torch.Tensor) and t.requires_grad]

    def step():
        inputs, seeds = next(pairs)
        for leaf in leaves:
            leaf.grad = None
        torch.autograd.backward(measure.flat_tensors(fn(*inputs)), seeds)

    return step


def host_and_gpu_us(step, tiny: bool) -> tuple[float, float, bool]:
    """(host us a step, GPU us a step, whether the host stayed ahead of the GPU throughout: where
    it did not, the launch queue filled up behind the sleep and the host waited, so its time is
    the GPU's, not its own; the llama block's ~100 launches a step do that within 50 steps)."""
    for _ in range(1 if tiny else 5):
        step()
    if tiny:
        start = time.perf_counter()
        step()
        return (time.perf_counter() - start) * 1e6, 0.0, True
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # ~1 s of GPU: the host never waits for it
    slept = torch.cuda.Event()
    slept.record()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.perf_counter()
    begin.record()
    for _ in range(STEPS):
        step()
    end.record()
    host = (time.perf_counter() - start) / STEPS * 1e6
    ahead = not slept.query()  # the GPU still asleep when the host had queued every step
    torch.cuda.synchronize()
    return host, begin.elapsed_time(end) * 1e3 / STEPS, ahead


def profile(step, steps: int) -> list[dict]:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:15]  # by own (total) time
    return [
        dict(function=f"{path.split('site-packages/')[-1]}:{line}({name})", own_us=tt / steps * 1e6, calls=nc // steps)
        for (path, line, name), (cc, nc, tt, ct, callers) in rows
    ]


def main(argv=None):
    run = harness.parse(argv, __doc__)
    names = os.environ.get("STEP_WORKLOADS", "rope_gqa_fwbw rope_gptj_fwbw").split()
    dtypes = [getattr(torch, d) for d in os.environ.get("STEP_DTYPES", "float32 bfloat16").split()]
    size = 4 if run.tiny else int(os.environ.get("STEP_SIZE", 2048))
    impls = {
        "eager": lambda f: f,
        "minicomp": minicomp.jit,
        "minicomp-aot": minicomp.jit,
        "minicomp-dynamo": lambda f: torch.compile(f, backend=minicomp_backend),
        "inductor": torch.compile,
    }
    chosen = os.environ.get("STEP_IMPLS", "eager minicomp minicomp-aot inductor").split()
    impls = {k: v for k, v in impls.items() if k in chosen and not (run.tiny and k == "inductor")}
    rows = []
    for name, dtype in itertools.product(names, dtypes):
        work = WORKLOADS[name]
        sets = run.input_sets(work.make, size, dtype)
        steps = {impl: (stepper(wrap(work.fn), sets), _settings(impl)) for impl, wrap in impls.items()}
        best = {}
        for _ in range(1 if run.tiny else ROUNDS):  # the implementations in turn, each round
            for impl, (step, settings) in steps.items():
                with config.override(**settings):
                    host, gpu, ahead = host_and_gpu_us(step, run.tiny)
                old = best.get(impl, (float("inf"), float("inf"), True))
                best[impl] = (min(old[0], host), min(old[1], gpu), old[2] and ahead)
        for impl, (step, settings) in steps.items():
            host, gpu, ahead = best[impl]
            row = dict(workload=name, dtype=str(dtype)[6:], impl=impl, host_us=host, gpu_us=gpu, host_ahead=ahead)
            with config.override(**settings):
                row["bench_us"] = 0.0 if run.tiny else run.time_ms(impls[impl](work.fn), sets, backward=True) * 1e3
                if impl.startswith("minicomp"):
                    row["top"] = profile(step, 1 if run.tiny else STEPS)
            rows.append(row)
            print({k: v for k, v in row.items() if k != "top"}, flush=True)
    run.write(size=size, steps=STEPS, rounds=ROUNDS, rows=rows)


def _settings(impl: str) -> dict:
    """minicomp-aot: every call through AOTAutograd's runtime (config lean_training off)."""
    return dict(lean_training=False) if impl == "minicomp-aot" else {}


if __name__ == "__main__":
    main(sys.argv[1:])
