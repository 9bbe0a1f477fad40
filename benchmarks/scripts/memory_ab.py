"""A suite model's training step in several variants side by side: time, GPU time, peak memory.

    PYTHONPATH=. python benchmarks/scripts/memory_ab.py MODEL VARIANT [VARIANT ...]

MODEL: a key of minicomp/bench/model_specs.MODELS; VARIANT as in minicomp/bench/model_row.py,
options included (`minicomp:chunk_budget_bytes=134217728`: issue #41's chunked loss). Every
variant is built in one process; per variant: the first step's seconds, the peak MiB above what was
allocated before a step, the GPU activities and busy ms of one step (torch.profiler), then the
median ms a step over 5 alternating rounds of 40 back-to-back steps, and its ratios to the first
variant's. The GPU only.
"""

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("MINICOMP_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

from minicomp.bench import model_row  # noqa: E402

ROUNDS, STEPS = 5, 40


def main(name: str, *variants: str) -> None:
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8 * len(variants))
    runs = {}
    for v in variants:
        start = time.perf_counter()
        runs[v] = model_row.real_step(name, "train", v)
        runs[v]()
        torch.cuda.synchronize()
        print(f"{name} {v}: first {time.perf_counter() - start:.1f}s", flush=True)
    peaks = {v: model_row.peak_mib(runs[v], "cuda") for v in variants}
    for v in variants:
        count, top, busy = model_row.kernels(runs[v], "cuda")
        print(f"{name} {v}: peak {peaks[v]:.0f} MiB, {count} kernels, GPU busy {busy:.2f} ms; top {top[:4]}")
    times = {v: [] for v in variants}
    for r in range(ROUNDS):
        for v in variants if r % 2 == 0 else variants[::-1]:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(STEPS):
                runs[v]()
            torch.cuda.synchronize()
            times[v].append((time.perf_counter() - start) / STEPS * 1e3)
    first = statistics.median(times[variants[0]])
    for v in variants:
        ms = statistics.median(times[v])
        print(
            f"{name} {v}: step {ms:.3f} ms ({ms / first:.3f}x {variants[0]}), "
            f"peak {peaks[v]:.0f} MiB ({peaks[v] / peaks[variants[0]]:.3f}x)",
            flush=True,
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
